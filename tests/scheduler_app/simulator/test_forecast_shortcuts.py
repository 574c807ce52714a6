"""The forecast's shortcuts (a plan that leaves every job as it was counts as repeated) change no estimate."""

from __future__ import annotations

import pytest

from scheduler_app.core.engine import schedule_round
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator.forecast import forecast
from tests.builders import make_cluster, make_job


def deep_queue(n: int) -> list:
    """Jobs of 1 to 4 GPUs and varied lengths: finishes come one by one, and some free GPUs that the
    job at the head of the queue cannot use (rounds that leave everyone as they were)."""
    models = ["res18", "alexnet", "lstm", "m5", "res50"]
    return [
        make_job(
            i, models[i % 5], gpus=(1, 2, 1, 4)[i % 4], arrival_s=float(i), total_iters=300.0 + 211 * (i % 7)
        )
        for i in range(1, n + 1)
    ]


@pytest.mark.parametrize("allocator", ["proportional", "tune"])
@pytest.mark.parametrize("restarts", [None, RestartPolicy()], ids=["free restarts", "restart costs"])
def test_shortcuts_give_the_same_forecast_with_fewer_rounds(allocator, restarts, monkeypatch):
    calls: list[float] = []

    def counted(*args, **kwargs):
        calls.append(kwargs["now_s"])
        return schedule_round(*args, **kwargs)

    monkeypatch.setattr("scheduler_app.simulator.forecast.schedule_round", counted)
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    jobs = deep_queue(40)
    kwargs = dict(policy="fifo", allocator=allocator, first_round_s=0.0, round_s=60.0, restarts=restarts)
    fast = forecast(cluster, jobs, **kwargs)
    fast_rounds = len(calls)
    slow = forecast(cluster, jobs, **kwargs, shortcuts=False)
    assert fast_rounds < len(calls) - fast_rounds  # the shortcut saved rounds
    assert all(f.finish_s is not None for f in slow.values())  # a whole forecast, not cut short
    assert {j: (f.start_s, pytest.approx(f.finish_s)) for j, f in fast.items()} == {
        j: (f.start_s, f.finish_s) for j, f in slow.items()
    }
