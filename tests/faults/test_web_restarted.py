"""Fault: the web tier (gunicorn, config/gunicorn.conf.py) stopped and started again while agents run
jobs: first gracefully (SIGTERM to the master, which lets its workers finish their requests, the
agents' long-polls included, for up to its graceful_timeout), then killed outright (SIGKILL to the
master and its workers at once, requests cut in the middle).

The agents keep their reports in their spools while nobody answers and send them again; afterwards
every report is stored exactly once and every job completes with exactly its iterations.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.faults.processes import wait_until
from tests.faults.stack import summary

# The agents' long-polls are held 30 s (ATTUNE_AGENT_WAIT_TIMEOUT_S), longer than gunicorn's graceful_timeout
# (20 s, config/gunicorn.conf.py): a graceful stop always ends by cutting the held waits at that timeout.
# 5 s here (GUNICORN_CMD_ARGS overrides the file) cuts them the same way, 15 s sooner.
pytestmark = [
    pytest.mark.faults,
    pytest.mark.timeout(180),
    pytest.mark.stack_env({"GUNICORN_CMD_ARGS": "--graceful-timeout 5"}),
]

JOBS = 14
DOWN_S = 2.0


def test_web_tier_restarted_while_agents_run_jobs(stack):
    t_start = time.monotonic()
    ids = []
    for i in range(JOBS):
        ids += stack.submit_ok(name=f"web-{i}", seconds=7)
    outages = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        running = stack.wait_running(ids, at_least=3)
        stored = sum(map(len, stack.stored_reports().values()))
        t0 = time.monotonic()
        stop_s = stack.stop_web(sig)
        time.sleep(DOWN_S)  # the agents' calls fail meanwhile; their reports wait in the spools
        pending = sum(len(a.spool()["pending"]) for a in stack.agents)
        stack.start_web()
        down_s = time.monotonic() - t0
        # The agents deliver again (after their retry backoff) before anything else happens.
        wait_until(
            lambda stored=stored: sum(map(len, stack.stored_reports().values())) > stored,
            timeout_s=60,
            what="the agents to deliver reports again",
            diagnose=stack.describe,
        )
        outages.append(
            f"{sig.name}: stop took {stop_s:.1f} s, down {down_s:.1f} s in all, with {running} jobs "
            f"running, {stored} reports stored before, {pending} waiting in the spools, delivered again "
            f"{time.monotonic() - t0 - down_s:.1f} s after the restart"
        )
        print(f"[web] {outages[-1]}")
    figures = stack.finish_and_check(ids)
    print(summary("web", figures, *outages, f"{time.monotonic() - t_start:.0f} s"))
