"""The fleet bench's verdict and load (bench/agent_fleet.py): what `--find-max` calls holding, and the
churn its defaults give, as docs/performance.md states them. The bench itself needs minutes and the
whole stack, so it runs by hand; these check its arithmetic and its bar without running it."""

import math

import pytest

from bench.agent_fleet import (
    DEFAULT_JOB_MINUTES,
    JOB_GPUS,
    REFERENCE_JOB_ENDS_PER_S_PER_100,
    STRESS_JOB_MINUTES,
    FleetResult,
    arguments,
)
from bench.fleet_agents import GPUS_PER_SERVER

# The jobs that fill a server's GPUs at the start run at once; the rest of JOB_GPUS waits in the queue.
RUNNING_JOBS_PER_SERVER = next(n for n in range(len(JOB_GPUS) + 1) if sum(JOB_GPUS[:n]) == GPUS_PER_SERVER)


def result(**changes) -> FleetResult:
    """A 1,000-agent run that holds on every count; `changes` spoil one."""
    fields = {
        "agents": 1000,
        "sync_p50_ms": 14.0,
        "sync_p99_ms": 136.5,
        "syncs_per_s": 108.4,
        "errors": 0,
        "healthz_p50_ms": 1.5,
        "healthz_p99_ms": 4.1,
        "delivery_p50_s": 0.12,
        "delivery_p99_s": 0.48,
        "deliveries": 188,
        "round_p50_ms": 784.0,
        "round_p99_ms": 1035.0,
        "rounds": 23,
        "reports_sent": 48320,
        "reports_stored": 48320,
        "stored_once": True,
        "cores": {"web": 0.48, "postgres": 0.21},
        "job_ends_per_s": 1.9,
        **changes,
    }
    return FleetResult(**fields)


def test_a_run_holds_only_when_all_four_conditions_do():
    assert result().holds(250.0, 2.0)
    assert not result(sync_p99_ms=250.0).holds(250.0, 2.0)
    assert not result(errors=1).holds(250.0, 2.0)
    assert not result(stored_once=False).holds(250.0, 2.0)
    # The fourth condition, which the bench printed but did not check before 2026-11-28.
    assert not result(delivery_p99_s=2.4).holds(250.0, 2.0)
    assert result(delivery_p99_s=2.4).holds(250.0, 3.0)
    # A window in which no round placed anything has no start command to be late.
    assert result(deliveries=0, delivery_p99_s=math.nan).holds(250.0, 2.0)


def test_the_churn_printed_is_per_100_servers_against_the_reference():
    # The reference: 36 jobs an hour on 512 GPUs, i.e. 64 servers of 8.
    reference_per_100_per_s = REFERENCE_JOB_ENDS_PER_S_PER_100
    assert reference_per_100_per_s == pytest.approx(36 / 3600 / 64 * 100)
    assert result(job_ends_per_s=1.9).churn_x_reference() == pytest.approx(12.16, abs=0.01)
    assert result(agents=500, job_ends_per_s=0.95).churn_x_reference() == pytest.approx(12.16, abs=0.01)


@pytest.mark.parametrize(("minutes", "times"), [(DEFAULT_JOB_MINUTES, 10), (STRESS_JOB_MINUTES, 100)])
def test_the_job_lengths_give_the_churn_the_docs_say(minutes, times):
    """Four jobs a server with lengths uniform in (a, b) minutes end 4 / (b - a) a server-minute."""
    low, high = minutes
    per_100_per_s = RUNNING_JOBS_PER_SERVER / (high - low) / 60 * 100
    assert per_100_per_s / REFERENCE_JOB_ENDS_PER_S_PER_100 == pytest.approx(times, rel=0.1)


def test_the_window_starts_once_the_first_jobs_can_have_ended():
    default = arguments([])
    assert default.job_minutes == list(DEFAULT_JOB_MINUTES)
    assert default.warmup == DEFAULT_JOB_MINUTES[0] * 60 + default.interval == 40.0
    stress = arguments(["--stress"])
    assert stress.job_minutes == list(STRESS_JOB_MINUTES) and stress.warmup == 70.0
    assert arguments(["--warmup", "5"]).warmup == 5.0
    assert arguments(["--job-minutes", "0.1", "1"]).warmup == 20.0  # never less than 20 s
    assert arguments(["--find-max"]).delivery_p99_s == 2.0
