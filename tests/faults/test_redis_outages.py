"""Fault: Redis stopped and started again (empty) many times in a row while agents run jobs.

Every process must come through all of them without a restart: the rounds' worker (a job submitted
after the last outage completes), the forecasts' worker (alive, and a forecast refresh runs after the
last outage), and each web process's agent long-poll (answered 200 and woken through Redis, not 503).
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.faults.long_poll import WAIT_PATH, check_long_poll_wakes
from tests.faults.processes import wait_until
from tests.faults.stack import summary

pytestmark = [pytest.mark.faults, pytest.mark.timeout(300)]

OUTAGES = 10
DOWN_S = (2.0, 3.5)  # each outage's length, drawn per outage
UP_S = (1.5, 3.0)  # Redis up between two outages: often shorter than Celery's reconnect backoff
JOBS_BEFORE = 10  # 8 GPUs: 8 run, 2 queue
JOB_S = (5.0, 12.0)
WAIT_UNAVAILABLE = f"503 GET {WAIT_PATH}"
REFRESHED = "Task scheduler_app.tasks.forecast_refresh_task["  # ... succeeded in ...
# After the last outage the agents' long-polls may answer 503 only until the web processes' Redis
# clients connect again (at once: a wait reads its generation on a new connection when the old one died).
WAIT_503_GRACE_S = 3.0


def _refreshes_done(log_text: str) -> int:
    return sum(REFRESHED in line and " succeeded in " in line for line in log_text.splitlines())


def test_redis_outages_in_a_row(stack):
    t_start = time.monotonic()
    seed = int(os.environ.get("ATTUNE_FAULTS_SEED") or time.time())
    rng = random.Random(seed)
    pids_before = stack.service_pids()
    ids = []
    for i in range(JOBS_BEFORE):
        ids += stack.submit_ok(name=f"before-{i}", seconds=rng.uniform(*JOB_S))
    stack.wait_running(ids, at_least=4)

    outages: list[tuple[float, float]] = []  # (down s, up s)
    during: list[int] = []  # the statuses of submissions while Redis was down
    answers_before = len(stack.access_log())
    for k in range(OUTAGES):
        down_s, up_s = rng.uniform(*DOWN_S), rng.uniform(*UP_S)
        stack.redis.stop()
        t_down = time.monotonic()
        response = stack.submit(name=f"during-{k}", seconds=rng.uniform(*JOB_S))
        during.append(response.status_code)
        if response.status_code == 201:
            ids.append(response.json()["id"])
        time.sleep(max(0.0, down_s - (time.monotonic() - t_down)))
        if k == OUTAGES - 1:
            db_now_back = stack.scalar("SELECT now()")
            refreshes_before = _refreshes_done(stack.tail("forecasts-worker.log", 10**9))
            access_at_back = len(stack.access_log())
        stack.redis.start()
        t_back = time.monotonic()
        outages.append((round(t_back - t_down, 1), round(up_s, 1)))
        # Every process is still there after each outage (a worker that exits does so within moments).
        alive = stack.service_pids()
        assert alive == pids_before, (
            f"after outage {k + 1}: processes {pids_before} became {alive}\n{stack.describe()}"
        )
        if k < OUTAGES - 1:
            time.sleep(up_s)
    print(f"[redis-loop] seed {seed}: {OUTAGES} outages (down s, then up s): {outages}")
    # A wait answers 503 at once when its Redis read fails: one logged after this grace failed after it.
    time.sleep(max(0.0, t_back + WAIT_503_GRACE_S - time.monotonic()))
    access_after_grace = len(stack.access_log())
    errors = {
        k: n for k, n in stack.errors_since(answers_before).items() if not k.startswith(WAIT_UNAVAILABLE)
    }
    assert during == [201] * OUTAGES, f"submissions while Redis was down were not all accepted: {during}"

    # The rounds: a round after the last outage, and a job submitted after it completes.
    stack.wait_round_since(db_now_back, timeout_s=40, what="a round after the last outage")
    round_s = time.monotonic() - t_back
    ids += stack.submit_ok(name="after", seconds=3)

    # The forecasts' worker: a refresh ran after the last outage (its log says so) and stored estimates
    # of jobs that were live then (a refresh stamps every live job's row; a submission only its own).
    wait_until(
        lambda: (
            _refreshes_done(stack.tail("forecasts-worker.log", 10**9)) > refreshes_before
            and _refreshed_rows(stack, db_now_back)
        ),
        timeout_s=40,
        what="a forecast refresh after the last outage",
        interval_s=0.2,
        diagnose=lambda: stack.describe(ids),
    )
    refresh_s = time.monotonic() - t_back
    refreshes = _refreshes_done(stack.tail("forecasts-worker.log", 10**9))

    figures = stack.finish_and_check(ids)
    # The long-poll: each web process answers held waits and is woken through its subscription, and the
    # agents' own waits since the last outage were answered, none with 503 after the grace.
    wakes = check_long_poll_wakes(stack)
    waits_after = [s for s, r in stack.access_log()[access_at_back:] if r == f"GET {WAIT_PATH}"]
    late_503 = sum(s == 503 and r == f"GET {WAIT_PATH}" for s, r in stack.access_log()[access_after_grace:])
    pids_after = stack.service_pids()
    assert pids_after == pids_before, f"processes restarted: {pids_before} -> {pids_after}"

    line = summary(
        "redis-loop",
        figures,
        f"seed {seed}, {OUTAGES} outages of {min(d for d, _ in outages)}-{max(d for d, _ in outages)} s",
        f"submissions while down: {during}",
        f"first round {round_s:.1f} s after the last outage, a forecast refresh {refresh_s:.1f} s after it "
        f"({refreshes} refreshes in all)",
        f"long-poll: {wakes['waits']} held waits over web processes {wakes['per_process']} all woken within "
        f"{wakes['slowest_s']} s; the agents' waits since the last outage {_counts(waits_after)}",
        f"no process restarted ({len(pids_before)} pids)",
        f"{time.monotonic() - t_start:.0f} s",
    )
    print(line)
    assert not errors, f"5xx answers other than the long-poll's 503 during the outages: {errors}\n{line}"
    assert waits_after and 200 in waits_after, f"no agent's wait answered 200 after the last outage: {line}"
    assert not late_503, f"the long-poll still answered 503 after the last outage: {late_503}\n{line}"


def _refreshed_rows(stack, since) -> int:
    """Forecast rows stored since `since` of jobs submitted before it: only a refresh writes those."""
    return stack.scalar(
        "SELECT COUNT(*) FROM scheduler_app_jobforecast f JOIN scheduler_app_job j ON j.id = f.job_id "
        "WHERE f.computed_at >= %s AND j.submitted_at < %s",
        [since, since],
    )


def _counts(statuses: list[int]) -> dict[int, int]:
    return {s: statuses.count(s) for s in sorted(set(statuses))}
