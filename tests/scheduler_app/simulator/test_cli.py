"""`python -m scheduler_app.simulator`: manage.py simulate's table, without Django, scipy or numpy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
TRACE = REPO_ROOT / "tests/data/synergy/static_100job.csv"


def test_entry_point_runs_without_django_scipy_or_numpy(tmp_path: Path) -> None:
    out_json = tmp_path / "runs.json"
    script = textwrap.dedent(
        f"""
        import runpy, sys
        sys.argv = ["x", "--trace", {str(TRACE)!r}, "--servers", "4", "--quiet", "--json", {str(out_json)!r}]
        try:
            runpy.run_module("scheduler_app.simulator", run_name="__main__")
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("django", "scipy", "numpy"))
        assert not heavy, heavy
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["policy", "allocator", "jobs", "avg"]
    assert [line.split()[1] for line in lines[1:3]] == ["proportional", "tune"]
    runs = json.loads(out_json.read_text())["runs"]
    assert [r["jobs"] for r in runs] == [100, 100]
    assert runs[0]["speedup_vs_proportional"] == 1.0


def test_bad_option_exits_2_with_the_reason() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler_app.simulator", "--allocator", "nope", "--jobs", "5"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "unknown allocator 'nope'" in out.stderr
