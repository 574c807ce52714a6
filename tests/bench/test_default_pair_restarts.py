"""bench.default_pair's restart-cost axis: the cost reaches every simulation and is part of a run's key."""

from __future__ import annotations

import json

import pytest

from bench import synergy_runs as runs
from bench.default_pair import QUICK, Pair, synergy_rows
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator.restart_costs import RestartCosts


@pytest.fixture
def fresh_runs(monkeypatch):
    monkeypatch.setattr(runs, "_RUNS", {})
    monkeypatch.setattr(runs, "_RAW", [])


def test_a_synergy_run_at_a_restart_cost_is_simulated_with_the_guard_and_its_costs(fresh_runs, monkeypatch):
    seen: list[dict] = []
    real = runs.simulate

    def recording(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "simulate", recording)
    w = runs.Workload(60, 9.0, runs.SPLITS["20,70,10"], False, 1)
    free = runs.run_windows(w, "fifo", "tune", [(20, 40)])
    charged = runs.run_windows(w, "fifo", "tune", [(20, 40)], 120.0)
    assert seen[0]["restarts"] is None and seen[0]["restart_costs"] is None
    assert isinstance(seen[1]["restarts"], RestartPolicy)
    assert seen[1]["restart_costs"] == RestartCosts(
        startup_s=120.0, checkpoint_every_s=runs.restart_axis.CHECKPOINT_EVERY_S, first_start_waits=True
    )
    # Two runs, two keys: a cost never answers from the free run's cache.
    assert len(runs._RUNS) == 2 and set(free) == set(charged) == {(20, 40)}
    assert [e.get("restart_cost_s") for e in runs._RAW] == [None, 120.0]


def test_a_progress_file_keeps_the_cost_of_each_run(fresh_runs, tmp_path):
    w = runs.Workload(60, 9.0, runs.SPLITS["20,70,10"], False, 1)
    runs.run_windows(w, "fifo", "tune", [(20, 40)], 120.0)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs._RAW))
    runs._RUNS.clear()
    runs.preload(path)
    assert list(runs._RUNS) == [(w, "fifo", "tune", ((20, 40),), 120.0)]


def test_default_pair_asks_every_synergy_run_at_the_cost(fresh_runs, monkeypatch):
    keys: list[tuple] = []

    def fake_prefetch(batch, workers):
        keys.extend(batch)
        for key in batch:
            runs._RUNS[key] = {key[3][0]: 1.0}

    monkeypatch.setattr("bench.default_pair.prefetch", fake_prefetch)
    monkeypatch.setattr("bench.default_pair.CANDIDATES", (Pair("swaf", "genie"), Pair("fifo", "tune")))
    rows = synergy_rows(QUICK, workers=1, restart_cost_s=30.0)
    assert keys and {k[4] for k in keys} == {30.0}
    assert rows and all(r.best == 1.0 for r in rows)
