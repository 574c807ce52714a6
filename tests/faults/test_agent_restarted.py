"""Fault: both agents SIGKILLed (the agent process alone) while their jobs run, then started again.

Each job runs under its shim in a session of its own (agent/shim.py), so the jobs live on; the
restarted agent adopts them from its spool's lease records. Nothing may start twice: a thread
samples /proc for the job processes (lease id from each one's environment), and each lease must
have had one process and one `started` report. Every job completes with exactly its iterations,
and the leases that were running at the kill ended as completed (or were moved by a round), never
failed or lost.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.job_processes import JobProcessWatcher
from tests.faults.processes import wait_until
from tests.faults.stack import summary

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

JOBS = 12
DOWN_S = 3.0


def test_agents_sigkilled_and_restarted_adopt_their_jobs(stack):
    t_start = time.monotonic()
    with JobProcessWatcher(str(stack.dir)) as watcher:
        ids = []
        for i in range(JOBS):
            ids += stack.submit_ok(name=f"adopt-{i}", seconds=10)
        stack.wait_running(ids, at_least=6)
        # The leases running now, and their processes as /proc shows them.
        at_kill = dict(
            stack.sql(
                "SELECT lease_id::text, job_id FROM scheduler_app_allocation "
                "WHERE job_id = ANY(%s) AND ended_at IS NULL",
                [ids],
            )
        )
        wait_until(
            lambda: set(at_kill) <= set(watcher.alive()),
            timeout_s=10,
            what="the running leases' processes to be seen in /proc",
        )
        pids_at_kill = {lease: pid for lease, pid in watcher.alive().items() if lease in at_kill}
        for agent in stack.agents:
            agent.kill()
        time.sleep(DOWN_S)
        still_alive = {lease for lease, pid in watcher.alive().items() if lease in at_kill}
        for agent in stack.agents:
            agent.start()
        print(
            f"[agent] killed both agents with {len(at_kill)} leases running; after {DOWN_S:.0f} s "
            f"{len(still_alive)} of their job processes were still alive (to adopt running; the others "
            "ended meanwhile, to be reported from their shims' status files); agents restarted"
        )
        figures = stack.finish_and_check(ids)
        watcher.sample()

    started = stack.started_reports_per_lease()
    end_reasons = dict(
        stack.sql(
            "SELECT lease_id::text, end_reason FROM scheduler_app_allocation WHERE job_id = ANY(%s)", [ids]
        )
    )
    our_leases = set(end_reasons)
    progressed = {
        lease
        for (lease,) in stack.sql(
            "SELECT DISTINCT lease_id::text FROM scheduler_app_agentreport WHERE kind = 'progress' "
            "AND lease_id::text = ANY(%s)",
            [list(our_leases)],
        )
    }
    # A lease can end before its agent launches it (a round moved the job, or the job finished through
    # its previous lease meanwhile): no process, no report. Every other lease ran once.
    ran = (set(started) | set(watcher.pids)) & our_leases
    twice = watcher.launched_twice()
    started_twice = {lease: n for lease, n in started.items() if n > 1}
    never_started = (set(watcher.pids) & our_leases) - set(started)
    unseen = progressed - set(watcher.pids)
    ended = {lease: end_reasons[lease] for lease in at_kill}
    bad_ends = {lease: r for lease, r in ended.items() if r not in ("completed", "preempted")}
    bad_events = stack.sql(
        "SELECT job_id, kind, to_state FROM scheduler_app_jobevent WHERE job_id = ANY(%s) "
        "AND to_state IN ('FAILED', 'NODE_FAIL', 'CANCELLED')",
        [ids],
    )
    same_pid = sum(1 for lease, pid in pids_at_kill.items() if watcher.pids[lease] == {pid})
    line = summary(
        "agent",
        figures,
        f"leases at the kill: {len(at_kill)}, {same_pid} kept their one process to the end, ended as "
        f"{sorted(set(ended.values()))}",
        f"leases: {len(our_leases)}, {len(ran)} ran, {len(our_leases) - len(ran)} ended before their "
        "agent launched them",
        f"job processes: {sum(len(watcher.pids.get(lease, ())) for lease in our_leases)}, launched twice: "
        f"{len(twice)}",
        f"'started' reports: {sum(started.get(lease, 0) for lease in our_leases)}",
        f"{time.monotonic() - t_start:.0f} s",
    )
    print(line)
    assert still_alive, f"every job ended while its agent was down: nothing was adopted running\n{line}"
    assert not twice, f"leases whose job was launched twice (lease: pids): {twice}\n{line}"
    assert not started_twice and not never_started, (
        f"'started' reports not once per lease that ran: {started_twice}, none for {never_started}\n{line}"
    )
    assert same_pid == len(at_kill), f"adopted jobs were not the same processes: {pids_at_kill}\n{line}"
    assert not bad_ends and not bad_events, f"leases ended badly: {bad_ends}, events {bad_events}\n{line}"
    # Every lease that ran for a while was seen in /proc, so the counts above cover them.
    assert not unseen, f"leases with progress whose process was never seen in /proc: {unseen}\n{line}"
