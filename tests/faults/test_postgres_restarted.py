"""Fault: PostgreSQL restarted (`pg_ctl restart -m fast`) while agents run jobs.

Every connection of the web tier and the worker is cut and the server refuses new ones for a
moment. The agents keep their reports in their spools and send them again; afterwards every report
is stored exactly once (per lease, the seqs 1..n the agent's spool handed out), every job completes
with exactly its iterations, and both the web tier and the rounds work again.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.processes import wait_until
from tests.faults.stack import summary

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

JOBS = 12
# Long enough that on a slow machine the first wave is still running, with its progress reported,
# when the test looks for it (6 s jobs finished unseen in a sibling test on a slow CI machine).
JOB_S = 12


def test_postgres_restarted_while_agents_run_jobs(stack):
    t_start = time.monotonic()
    ids = []
    for i in range(JOBS):
        ids += stack.submit_ok(name=f"pg-{i}", seconds=JOB_S)
    running = stack.wait_running(ids, at_least=4)
    before = stack.stored_reports()
    down_s = stack.pg.restart()
    rounds_after_restart = stack.last_round_id()
    print(
        f"[postgres] restarted with {running} jobs running and {sum(map(len, before.values()))} reports "
        f"stored; pg_ctl restart -m fast took {down_s:.1f} s"
    )
    # The scheduler works again: a round completes after the restart.
    wait_until(
        lambda: stack.last_round_id() > rounds_after_restart,
        timeout_s=30,
        what="a round after PostgreSQL's restart",
        diagnose=stack.describe,
    )
    figures = stack.finish_and_check(ids)
    line = summary(
        "postgres",
        figures,
        f"5xx while it restarted: {sum(n for s, n in figures['web'].items() if s >= 500)}",
        f"{time.monotonic() - t_start:.0f} s",
    )
    print(line)
