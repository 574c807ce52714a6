"""Database-vendor checks live in infra/: elsewhere code asks infra.vendor.is_postgresql()."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("agent", "cli", "cluster_app", "config", "notify_app", "profiles_app", "scheduler_app")
VENDOR_CHECK = re.compile(r"\.vendor\s*[!=]=")


def test_no_vendor_check_outside_infra():
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts  # a migration runs on its schema editor's connection
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if VENDOR_CHECK.search(line)
    ]
    assert found == []
