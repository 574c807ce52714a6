"""Fault: a node's agent SIGKILLed for good, and a node cut off from the service while its agent lives.

Fencing (docs/faults.md): a lease not renewed for the fence time is stopped on its node, by its shim
when the agent is dead and by the agent when it cannot reach the service; the service starts the job
elsewhere only once the fence, its grace and a margin have passed since the node's last sync. A thread
samples /proc for the job processes (lease id from each one's environment, start time from the kernel):
the old incarnation must be gone before the new one starts, never both at once.
"""

from __future__ import annotations

import time

import pytest

from tests.faults.job_processes import JobProcessWatcher
from tests.faults.partition import PartitionableRelay
from tests.faults.processes import wait_until
from tests.faults.stack import Stack

FENCE_S, GRACE_S, MARGIN_S = 6, 2, 1
# The node goes DOWN (and its jobs are requeued) as soon as the fence allows: 9 s after its last sync.
FENCE_ENV = {
    "ATTUNE_NODE_NOT_RESPONDING_AFTER_S": "3",
    "ATTUNE_LEASE_FENCE_S": str(FENCE_S),
    "ATTUNE_LEASE_FENCE_GRACE_S": str(GRACE_S),
    "ATTUNE_LEASE_FENCE_MARGIN_S": str(MARGIN_S),
    "ATTUNE_NODE_DOWN_AFTER_S": str(FENCE_S + GRACE_S + MARGIN_S),
}
# The shim and the agent look at the renewal every second; the watcher samples /proc about as often.
SLACK_S = 3.0

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240), pytest.mark.stack_env(FENCE_ENV)]


def job_leases(stack: Stack, job_id: int) -> list[tuple[str, str]]:
    """(lease id, server name) of each lease of the job, oldest first."""
    return stack.sql(
        "SELECT a.lease_id::text, s.name FROM scheduler_app_allocation a "
        "JOIN cluster_app_server s ON s.id = a.server_id WHERE a.job_id = %s ORDER BY a.id",
        [job_id],
    )


def running_incarnation(stack: Stack, watcher: JobProcessWatcher, job_id: int) -> tuple[str, str, int]:
    """The job's running lease, its server and its process, once /proc shows it."""

    def found():
        alive = watcher.alive()
        for lease, node in reversed(job_leases(stack, job_id)):
            if lease in alive:
                return lease, node, alive[lease]
        return None

    return wait_until(
        found, timeout_s=40, what=f"job {job_id}'s process", diagnose=lambda: stack.describe([job_id])
    )


def next_incarnation(
    stack: Stack, watcher: JobProcessWatcher, job_id: int, old_lease: str
) -> tuple[str, str, int]:
    def found():
        alive = watcher.alive()
        for lease, node in job_leases(stack, job_id):
            if lease != old_lease and lease in alive:
                return lease, node, alive[lease]
        return None

    return wait_until(
        found,
        timeout_s=90,
        what=f"job {job_id} to run again elsewhere",
        diagnose=lambda: stack.describe([job_id]),
    )


def check_no_overlap(watcher: JobProcessWatcher, old_pid: int, new_pid: int) -> tuple[float, float]:
    """The old process's end (an upper bound) and the new one's start; asserts the first is earlier."""
    gone_by = wait_until(
        lambda: watcher.gone_by(old_pid), timeout_s=10, what="a sample after the old process"
    )
    new_start = watcher.lifetimes[new_pid][0]
    assert gone_by < new_start, (
        f"two incarnations at once: the old process {old_pid} lived until at least "
        f"{watcher.lifetimes[old_pid][1]:.2f} (gone by {gone_by:.2f}), the new one {new_pid} started at "
        f"{new_start:.2f}"
    )
    return gone_by, new_start


def completes_with_invariants(stack: Stack, job: int) -> None:
    wait_until(
        lambda: stack.all_completed([job]),
        timeout_s=90,
        what="the job to complete",
        diagnose=lambda: stack.describe([job]),
    )
    stack.check_invariants()


def test_a_dead_agents_job_is_stopped_by_its_shim_before_it_runs_elsewhere(stack):
    t0 = time.monotonic()
    with JobProcessWatcher(str(stack.dir)) as watcher:
        [job] = stack.submit_ok(name="orphan", seconds=40)
        stack.wait_running([job], at_least=1)
        lease, node, old_pid = running_incarnation(stack, watcher, job)
        agent = next(a for a in stack.agents if a.name == node)
        agent.kill()  # and never started again
        killed_at = time.time()
        _new_lease, new_node, new_pid = next_incarnation(stack, watcher, job, lease)
        gone_by, new_start = check_no_overlap(watcher, old_pid, new_pid)
    line = (
        f"[fenced] agent of {node} SIGKILLed for good with job {job} running (pid {old_pid}); the job's "
        f"process was gone {gone_by - killed_at:.1f} s later (fence {FENCE_S} s, grace {GRACE_S} s); "
        f"its next incarnation (pid {new_pid}, on {new_node}) started {new_start - killed_at:.1f} s after "
        f"the kill, {new_start - gone_by:.1f} s after the old one was gone; {time.monotonic() - t0:.0f} s"
    )
    print(line)
    assert new_node != node, line
    # The shim's fence: SIGTERM at the fence after the last renewal (before the kill), the workload
    # checkpoints and exits at once.
    assert gone_by - killed_at <= FENCE_S + SLACK_S, line
    completes_with_invariants(stack, job)


def test_a_partitioned_node_stops_its_jobs_within_the_fence(stack):
    t0 = time.monotonic()
    relays = {}
    for agent in stack.agents:  # each agent talks to the service through a link the test can cut
        relays[agent.name] = PartitionableRelay(stack.port)
        agent.stop()
        agent.args[agent.args.index(stack.url)] = relays[agent.name].url
        agent.start()
    try:
        with JobProcessWatcher(str(stack.dir)) as watcher:
            [job] = stack.submit_ok(name="partitioned", seconds=40)
            stack.wait_running([job], at_least=1)
            lease, node, old_pid = running_incarnation(stack, watcher, job)
            agent = next(a for a in stack.agents if a.name == node)
            relays[node].cut()
            cut_at = time.time()
            gone_by = wait_until(
                lambda: old_pid not in watcher.alive().values() and watcher.gone_by(old_pid),
                timeout_s=FENCE_S + GRACE_S + 10,
                what="the partitioned node to stop its job",
                diagnose=lambda: agent.log_tail(),
            )
            assert agent.alive(), "the partitioned node's agent died"
            _new_lease, new_node, new_pid = next_incarnation(stack, watcher, job, lease)
            _, new_start = check_no_overlap(watcher, old_pid, new_pid)
            relays[node].heal()
            # The agent delivers the lease's exit once it reaches the service again: stopped by the fence.
            stop = wait_until(
                lambda: next(
                    iter(
                        stack.sql(
                            "SELECT data->>'stop' FROM scheduler_app_agentreport WHERE lease_id::text = %s "
                            "AND kind = 'exited'",
                            [lease],
                        )
                    ),
                    [None],
                )[0],
                # The agent retries a failing service with backoff (up to 30 s between tries).
                timeout_s=75,
                what="the fenced lease's exit report",
                diagnose=lambda: agent.log_tail(),
            )
        line = (
            f"[fenced] {node} cut off from the service with job {job} running (pid {old_pid}); its agent "
            f"stopped the job {gone_by - cut_at:.1f} s after the cut (fence {FENCE_S} s, grace {GRACE_S} s); "
            f"the next incarnation (pid {new_pid}, on {new_node}) started {new_start - cut_at:.1f} s after "
            f"the cut; the exit report, delivered after the link healed, says stop={stop}; "
            f"{time.monotonic() - t0:.0f} s"
        )
        print(line)
        assert gone_by - cut_at <= FENCE_S + SLACK_S, line
        assert stop == "fence", line
        # Either fence may act first: the agent's supervisor (its log) or the job's shim (the lease's
        # output). Which one wins is a race of a second or so; both stop the job with stop=fence.
        fence_lines = agent.log_path.read_text(errors="replace") + "".join(
            p.read_text(errors="replace") for p in (agent.work_dir / "leases" / lease).glob("output.log")
        )
        assert "not renewed" in fence_lines, agent.log_tail()
        completes_with_invariants(stack, job)
    finally:
        for relay in relays.values():
            relay.close()
