"""The forecast runs in wall time: a fake node's job views (profile, start-up, lease age: the job's own
time in a round) are turned into wall seconds by the cluster's time scale."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from scheduler_app.services.forecasts import _in_wall_time
from tests.builders import make_job

NOW_S = 1_800_000_000.0


def catalog_job() -> SimpleNamespace:
    return SimpleNamespace(workload_id=1, total_iters=1000)


def test_a_fake_nodes_lease_age_startup_and_iteration_time_become_wall_time():
    own = dataclasses.replace(make_job(1), startup_s=30.0, lease_started_s=NOW_S - 200.0)
    wall = _in_wall_time(own, catalog_job(), leases=(), scale=0.05, now_s=NOW_S)
    assert NOW_S - wall.lease_started_s == pytest.approx(10.0)  # 200 s of its own time: 10 s of wall
    assert wall.startup_s == pytest.approx(1.5)
    assert wall.profile.iter_time_s == pytest.approx(own.profile.iter_time_s * 0.05)


def test_on_real_nodes_the_view_is_unchanged():
    own = dataclasses.replace(make_job(1), startup_s=30.0, lease_started_s=NOW_S - 200.0)
    assert _in_wall_time(own, catalog_job(), leases=(), scale=1.0, now_s=NOW_S) is own
