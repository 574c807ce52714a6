"""bench.moves_per_round's events with and without restart costs, at a size a test can run."""

from __future__ import annotations

import pytest

from bench.moves_per_round import round_changes
from scheduler_app.core.restarts import RestartPolicy


def test_a_node_joining_moves_many_running_jobs_without_restart_costs_and_none_with_them():
    # tune alone re-packs when room appears (the demo's moves when a node joined); the guard keeps
    # every running job where it is, since none of those moves pays for its restart.
    free = [c.restarts for c in round_changes("tune", servers=100, rounds=3, ending=10, event="join")]
    guarded = [
        c.restarts
        for c in round_changes(
            "tune", servers=100, rounds=3, ending=10, event="join", restarts=RestartPolicy()
        )
    ]
    assert max(free) > 10, free
    assert guarded == [0, 0, 0], guarded


@pytest.mark.parametrize("event", ["ending", "profile", "queue"])
def test_with_restart_costs_other_events_restart_few_running_jobs(event):
    changes = list(
        round_changes("tune", servers=100, rounds=3, ending=10, event=event, restarts=RestartPolicy())
    )
    assert all(c.restarts <= 3 for c in changes), changes
    assert all(c.preempted == 0 for c in changes), changes


def test_unknown_event_is_refused():
    with pytest.raises(ValueError, match="event must be one of"):
        next(round_changes("tune", servers=2, rounds=1, ending=1, event="reboot"))
