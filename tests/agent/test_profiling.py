"""Profiling runs on the agent: the `profile` command, points measured through the launcher and reported.

The fake service plays the real one's part: it runs the CPU search (profiles_app/optimistic.py, pure
Python) over the points reported so far and answers each sync with the core counts still to measure.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any

import pytest

from profiles_app.catalog import load_catalog, load_profiling_inputs
from profiles_app.optimistic import (
    derive_profile,
    interpolate_seconds,
    next_cpu_counts,
    per_gpu,
    relative_error,
)
from tests.agent.conftest import TIME_SCALE
from tests.agent.fake_service import wait_for

RUN_ID = "3f2c7a8e-1d2b-4c5d-9e8f-0a1b2c3d4e5f"


def points_of(service, run_id: str = RUN_ID) -> dict[int, float]:
    return {
        r["data"]["cpus"]: r["data"]["sec_per_iter"] for r in service.reports_for(run_id, "profile_point")
    }


def profile_command(gpu: str, *, argv: list[str], cpu_counts: list[int], warmup: bool, **extra: Any) -> dict:
    return {
        "kind": "profile",
        "lease_id": RUN_ID,
        "workload": "test",
        "argv": argv,
        "env": {"ATTUNE_WARMUP_ITERS": "2"},
        "gpu_uuids": [gpu],
        "num_cpus": max(cpu_counts),
        "mem_gb": 250.0,
        "cpu_counts": cpu_counts,
        "warmup": warmup,
        "iters": 20,
        "warmup_iters": 2,
        **extra,
    }


def searching_service(service, gpu: str, *, argv: list[str], max_cpus: int) -> None:
    """Answer syncs like the service: the search's next core counts; `cancel` once the run is done."""

    def answer(running: list[str]) -> list[dict]:
        points = points_of(service)
        todo = next_cpu_counts(points, max_cpus=max_cpus)
        if not todo:
            return [{"kind": "cancel", "lease_id": RUN_ID, "grace_s": 1}] if RUN_ID in running else []
        command = profile_command(gpu, argv=argv, cpu_counts=todo, warmup=not points)
        command["num_cpus"] = max_cpus
        return [command]

    service.command_fn = answer


def synthetic(model: str, iters: int = 25) -> list[str]:
    return [
        "python",
        "-m",
        "agent.workload",
        "--model",
        model,
        "--iters",
        str(iters),
        "--progress-every-s",
        "0.05",
    ]


def test_agent_profiles_a_synthetic_workload_along_the_cpu_search(service, make_agent, tmp_path):
    agent = make_agent()
    gpu = agent.gpus[0].uuid
    searching_service(service, gpu, argv=synthetic("res18"), max_cpus=24)
    agent.start()
    wait_for(lambda: RUN_ID in agent.leases.running_ids(), timeout_s=10)
    assert gpu in agent.leases.busy_gpu_uuids()  # no job may start on the profiling run's GPU
    wait_for(lambda: not next_cpu_counts(points_of(service), max_cpus=24), timeout_s=60)
    wait_for(lambda: RUN_ID not in agent.leases.running_ids(), timeout_s=10)

    profile = load_catalog()["res18"]
    truth = {
        c: profile.iter_time_s / row[-1]
        for c, row in zip(profile.cpu_per_gpu_grid, profile.tput, strict=True)
    }
    points = points_of(service)
    assert 2 <= len(points) <= 9
    for cpus, seconds in points.items():
        # Synthetic jobs run at exactly their profile's speed; the agent takes the time scale out.
        assert seconds == pytest.approx(interpolate_seconds(truth, cpus), rel=0.01), cpus
    reports = service.reports_for(RUN_ID)
    assert [r["seq"] for r in reports] == list(range(1, len(reports) + 1))
    first = reports[0]["data"]
    assert first["cpus"] == 24 and first["time_scale"] == TIME_SCALE
    assert first["mem_gbps"] > 0 and first["disk_mbps"] > 0 and first["peak_rss_mb"] > 0
    # The first launch warmed up and was not reported.
    assert (tmp_path / "work" / "profiles" / RUN_ID / "c24-warmup" / "job" / "progress.json").exists()

    # What the service derives from these points: res18's catalog row, every cell within 3 %.
    node, datasets = load_profiling_inputs()
    derived = derive_profile(per_gpu(points, 1), dataset=datasets["res18"], node=node)
    for drow, trow in zip(derived.tput, profile.tput, strict=True):
        assert all(relative_error(d, t) <= 0.03 for d, t in zip(drow, trow, strict=True))


def test_a_point_that_fails_is_reported_and_ends_the_measuring(service, make_agent):
    agent = make_agent()
    gpu = agent.gpus[0].uuid
    argv = [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"]
    service.commands = [profile_command(gpu, argv=argv, cpu_counts=[4, 1], warmup=False)]
    agent.start()
    error = wait_for(lambda: service.reports_for(RUN_ID, "profile_error"), timeout_s=10)[0]["data"]
    assert error["cpus"] == 4 and error["exit_code"] == 3
    assert "boom" in error["log_tail"]
    assert not service.reports_for(RUN_ID, "profile_point")
    assert RUN_ID in agent.leases.running_ids()  # until the service ends the run
    service.commands = [{"kind": "cancel", "lease_id": RUN_ID, "grace_s": 1}]
    wait_for(lambda: RUN_ID not in agent.leases.running_ids(), timeout_s=10)
    assert len(service.reports_for(RUN_ID)) == 1


def test_a_job_start_waits_for_the_gpu_of_a_profiling_run(service, make_agent):
    agent = make_agent()
    gpu = agent.gpus[0].uuid
    service.commands = [
        profile_command(gpu, argv=synthetic("alexnet", iters=40), cpu_counts=[3], warmup=False)
    ]
    agent.start()
    wait_for(lambda: RUN_ID in agent.leases.running_ids(), timeout_s=10)
    from tests.agent.conftest import start_cmd

    service.commands = [*service.commands, start_cmd("lease-1", gpu_uuids=[gpu], iters=10)]
    wait_for(lambda: service.reports_for(RUN_ID, "profile_point"), timeout_s=20)
    assert not service.reports_for("lease-1")  # the job could not start while the run held its GPU
    service.commands = [
        start_cmd("lease-1", gpu_uuids=[gpu], iters=10),
        {"kind": "cancel", "lease_id": RUN_ID},
    ]
    wait_for(lambda: service.exited("lease-1"), timeout_s=20)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("PIL") is None,
    reason="the real workload needs torch and Pillow (pip install -r requirements-profiling.txt)",
)
def test_agent_profiles_the_real_pytorch_workload(service, make_agent, tmp_path):
    """A real CPU training loop (JPEG decoding and augmentation in DataLoader workers), profiled at every
    core count this machine has: the same code path as the synthetic workload, only argv differs."""
    agent = make_agent(time_scale=1.0)
    cores = min(2, len(__import__("os").sched_getaffinity(0)))
    agent.leases.num_cpus = cores  # the real machine, no fake cores: measurements must not share cores
    gpu = agent.gpus[0].uuid
    argv = ["python", "-m", "agent.torch_workload", "--iters", "22", "--num-images", "128"]
    searching_service(service, gpu, argv=argv, max_cpus=cores)
    agent.start()
    wait_for(lambda: not next_cpu_counts(points_of(service), max_cpus=cores), timeout_s=240)
    points = points_of(service)
    assert sorted(points) == list(range(1, cores + 1))
    assert all(s > 0 for s in points.values())
    data_dir = tmp_path / "work" / "profiles" / RUN_ID / "data"
    assert len(list(data_dir.glob("*.jpg"))) == 128  # generated once (warm-up), read by every point
    log = (tmp_path / "work" / "profiles" / RUN_ID / f"c{cores}" / "output.log").read_text()
    assert f"{cores} core(s) -> {cores - 1} loader worker(s)" in log
    print("torch workload, seconds per iteration by cores:", json.dumps(points))
