"""The simulator is framework-free and deterministic."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate
from tests.scheduler_app.simulator.fakes import FifoPolicy, StickyProportionalAllocator

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_simulator_imports_no_django() -> None:
    # A fresh interpreter: this test process may already have Django loaded by conftest.
    script = textwrap.dedent(
        """
        import sys
        import scheduler_app.simulator as sim
        from scheduler_app.core import engine
        jobs = sim.philly_derived_trace(20, seed=1)
        loaded = sorted(m for m in sys.modules if m == "django" or m.startswith("django."))
        assert not loaded, loaded
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_same_seed_same_result() -> None:
    cluster = ClusterSpec(servers=2, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)

    def once() -> dict:
        trace = philly_derived_trace(60, jobs_per_hour=20.0, multi_gpu=True, seed=123)
        result = simulate(trace, cluster, policy=FifoPolicy(), allocator=StickyProportionalAllocator())
        data = result.to_dict()
        data.pop("wall_s")
        return data

    first, second = once(), once()
    assert first == second
    assert first["finished_jobs"] == 60
