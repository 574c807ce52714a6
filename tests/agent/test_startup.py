"""A lease's start-up as the agent measures it (launch to first progress), with real job processes: in
the first progress report only, to a tick, across an agent restart, never for a job without progress."""

from __future__ import annotations

from tests.agent.conftest import python_job, start_cmd
from tests.agent.fake_service import wait_for


def slow_starter(startup_s: float, reports: int = 5) -> list[str]:
    """An own command that sets up for `startup_s`, then writes its progress file (atomically) a few
    times, as docs/cli.md tells users to."""
    return python_job(
        "import json, os, time\n"
        f"time.sleep({startup_s})\n"
        "path = os.environ['ATTUNE_PROGRESS_PATH']\n"
        f"for done in range(1, {reports + 1}):\n"
        "    with open(path + '.tmp', 'w') as fh:\n"
        "        json.dump({'done_iters': done}, fh)\n"
        "    os.replace(path + '.tmp', path)\n"
        "    time.sleep(0.3)\n"
    )


def startups(service, lease_id: str) -> list[float]:
    return [
        r["data"]["startup_s"] for r in service.reports_for(lease_id, "progress") if "startup_s" in r["data"]
    ]


def test_the_first_progress_report_carries_the_leases_startup(service, make_agent):
    # Syncs every 2 s: a start-up measured when progress is reported would be off by up to that.
    service.sync_interval_s = 2.0
    agent = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], argv=slow_starter(1.2))]
    agent.start()
    wait_for(lambda: service.exited("lease-1"), timeout_s=20)
    progress = service.reports_for("lease-1", "progress")
    assert len(progress) >= 2 and progress[0]["data"]["done_iters"] == 1
    assert "startup_s" in progress[0]["data"]  # the first one, and no other
    (measured,) = startups(service, "lease-1")
    # The job slept 1.2 s before its first write; the interpreter's start and a tick (0.05 s) on top.
    assert 1.2 <= measured < 1.2 + 0.6, measured


def test_a_job_that_never_reports_progress_has_no_startup(service, make_agent):
    agent = make_agent()
    job = python_job("import time; print('no progress', flush=True); time.sleep(0.5)")
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], argv=job)]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-1"), timeout_s=10)
    assert exited["data"]["exit_code"] == 0
    assert not service.reports_for("lease-1", "progress") and startups(service, "lease-1") == []


def test_a_restarted_agent_measures_an_adopted_lease_from_its_launch(service, make_agent):
    first = make_agent(stop_leases_on_exit=False)
    service.commands = [start_cmd("lease-1", gpu_uuids=[first.gpus[0].uuid], argv=slow_starter(2.5))]
    first.start()
    wait_for(lambda: service.reports_for("lease-1", "started"))
    first.shutdown()  # the job keeps setting up meanwhile
    assert not service.reports_for("lease-1", "progress")

    second = make_agent()
    second.start()
    wait_for(lambda: service.exited("lease-1"), timeout_s=20)
    (measured,) = startups(service, "lease-1")
    assert 2.5 <= measured < 2.5 + 0.8, measured  # from the first agent's launch, not the adoption
