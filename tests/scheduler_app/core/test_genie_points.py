"""genie_points.ShapePoints answers what the QoS code computed point by point before, to the last bit."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie_candidates import points_by_cost
from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.throughput import EPS, REFERENCE_SHAPE, ServerShape, best_case, with_penalty
from scheduler_app.core.types import JobView, SensitivityProfile
from scheduler_app.simulator import ClusterSpec
from scheduler_app.simulator.reuse import RememberingPolicy

CATALOG = load_catalog()
SHAPES = (REFERENCE_SHAPE, ServerShape(4, 20.0, 300.0))


def _cases() -> list[tuple[SensitivityProfile, int, int, ServerShape]]:
    return [
        (profile, k, servers, shape)
        for profile in CATALOG.values()
        for k in (1, 2, 4, 8, 16)
        for servers in (1, 2, 3)
        for shape in SHAPES
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_best_speed_and_speeds_are_the_old_expressions(shape):
    for profile, k, servers, _ in _cases():
        sp = shape_points(profile, k, servers, shape)
        assert sp.best_speed == with_penalty(best_case(profile, k, shape).speed, profile, servers, k)
        points = points_by_cost(profile, k, shape)
        assert sp.points == points
        assert sp.speeds == [with_penalty(p.speed, profile, servers, k) for p in points]


def test_meeting_count_names_the_set_of_points_meeting_a_need():
    rng = random.Random(3)
    for profile, k, servers, shape in _cases():
        sp = shape_points(profile, k, servers, shape)
        needs = [rng.uniform(0.0, sp.best_speed * 1.2) for _ in range(20)] + list(sp.speeds)
        for need in needs:
            meeting = [i for i, v in enumerate(sp.speeds) if v >= need - EPS]
            assert sp.meeting_count(need) == len(meeting)
            options, least_cpus, least_mem_gb = sp.qos_options(need)
            assert options == [(sp.points[i], reasons.QOS_FIT) for i in meeting]
            if options:
                assert least_cpus == min(p.cpus_per_gpu for p, _ in options)
                assert least_mem_gb == min(p.mem_gb_per_gpu for p, _ in options)


def test_cheapest_gpu_s_is_the_old_minimum():
    rng = random.Random(5)
    for profile, k, servers, shape in _cases():
        sp = shape_points(profile, k, servers, shape)
        for _ in range(10):
            work_s = rng.uniform(10.0, 1e6)
            needed = rng.uniform(0.0, sp.best_speed * 1.1)
            old = None
            for p in points_by_cost(profile, k, shape):
                speed = with_penalty(p.speed, profile, servers, k)
                if speed < needed - EPS:
                    continue
                dominant = max(
                    1.0, p.cpus_per_gpu / shape.cpus_per_gpu, p.mem_gb_per_gpu / shape.mem_gb_per_gpu
                )
                need = k * dominant * work_s / speed
                if old is None or need < old:
                    old = need
            assert sp.cheapest_gpu_s(work_s, needed) == old


def test_the_memo_follows_the_profile_object_not_its_id():
    profile = CATALOG["resnet18"] if "resnet18" in CATALOG else next(iter(CATALOG.values()))
    first = shape_points(profile, 2, 1, REFERENCE_SHAPE)
    assert shape_points(profile, 2, 1, REFERENCE_SHAPE) is first
    assert shape_points(profile, 2, 1, ServerShape(8, 24.0, 500.0)) is first  # an equal shape
    other = replace(profile)  # equal, another object
    assert shape_points(other, 2, 1, REFERENCE_SHAPE) is not first
    assert shape_points(other, 2, 1, REFERENCE_SHAPE).profile is other


def test_a_remembered_order_is_the_policys_own():
    class Counting(SwafPolicy):
        calls = 0

        def order(self, jobs, snapshot, now_s):
            Counting.calls += 1
            return super().order(jobs, snapshot, now_s)

    policy = RememberingPolicy(Counting())
    snapshot = ClusterSpec(
        servers=1, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0
    ).snapshot()
    profile = next(iter(CATALOG.values()))
    jobs = [
        JobView(job_id=i, num_gpus=1, arrival_s=float(i), profile=profile, total_iters=100.0 * (5 - i))
        for i in range(4)
    ]
    first = policy.order(jobs, snapshot, 10.0)
    assert policy.order(list(jobs), snapshot, 10.0) == first and Counting.calls == 1
    assert policy.order(jobs, snapshot, 20.0) == Counting().order(jobs, snapshot, 20.0)
    assert Counting.calls == 3
