"""scheduler_app.core must stay framework-free: importing it (and running a round) loads no Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import sys
import scheduler_app.core.engine
import scheduler_app.core.throughput
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.policies import POLICIES
from tests.builders import make_cluster, make_job
for allocator in ALLOCATORS.names():
    for policy in POLICIES.names():
        scheduler_app.core.engine.schedule_round(
            make_cluster(2), [make_job(1, gpus=4), make_job(2, "alexnet")],
            policy=policy, allocator=allocator, now_s=0.0,
        )
loaded = sorted(m for m in sys.modules if m == "django" or m.startswith("django."))
assert not loaded, loaded
"""


def test_core_imports_and_runs_without_django():
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
