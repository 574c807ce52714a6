"""The speed model: matrix lookups, the two operating points, the reference's capping rule."""

from __future__ import annotations

import dataclasses

import pytest

from profiles_app.catalog import profile_for
from scheduler_app.core.throughput import (
    REFERENCE_SHAPE,
    OperatingPoint,
    ServerShape,
    best_case,
    cluster_shape,
    intermediate_points,
    needs_downgrade,
    proportional_tput,
    relative_speed,
    tput,
    with_penalty,
)
from tests.builders import make_cluster, make_server

RES18 = profile_for("res18")
ALEXNET = profile_for("alexnet")
M5 = profile_for("m5")
BERT = profile_for("bert")
LSTM = profile_for("lstm")


@pytest.mark.parametrize(
    ("cpus", "mem_gb", "expected"),
    [
        (9, 62.5, 2.4),  # on the grid
        (8.9, 62.5, 1.75),  # largest grid point <= 8.9 is 6
        (6, 124.9, 1.75),  # memory rounds down to 62.5
        (3, 62.5, 1.0),  # the proportional point
        (0.5, 10, 0.1),  # below the grid: the smallest point
        (100, 1000, 2.4),  # above the grid: the largest point
    ],
)
def test_tput_takes_largest_grid_points_below_the_allocation(cpus, mem_gb, expected):
    assert tput(RES18, cpus, mem_gb) == pytest.approx(expected)


def test_proportional_tput_depends_on_the_server_shape():
    assert proportional_tput(RES18, REFERENCE_SHAPE) == pytest.approx(1.0)
    assert proportional_tput(RES18, ServerShape(8, 32, 500)) == pytest.approx(1.3)  # 4 cores/GPU


def test_best_case_uncapped_is_the_profile_demand_and_speedup():
    assert best_case(RES18, 1, REFERENCE_SHAPE) == OperatingPoint(9.0, 62.5, 2.4, capped=False)
    assert best_case(RES18, 2, REFERENCE_SHAPE).speed == pytest.approx(2.4)  # 18 cores still fit


def test_best_case_cpu_capped_interpolates_speedup_linearly_in_cpu():
    # res18 x4: ideal 36 cores > 24 -> 24 cores (6/GPU); fair 12; 1 + 1.4 * (24-12)/(36-12) = 1.7
    point = best_case(RES18, 4, REFERENCE_SHAPE)
    assert (point.cpus_per_gpu, point.mem_gb_per_gpu, point.capped) == (6.0, 62.5, True)
    assert point.speed == pytest.approx(1.7)
    # alexnet x4: 48 cores -> 24, memory 500 exactly fits; 1 + 1.94 * 12/36
    point = best_case(ALEXNET, 4, REFERENCE_SHAPE)
    assert (point.cpus_per_gpu, point.mem_gb_per_gpu) == (6.0, 125.0)
    assert point.speed == pytest.approx(1 + 1.94 / 3)


def test_best_case_memory_only_capped_keeps_speedup_like_the_reference():
    # m5 x3: 18 cores fit, 562.5 GB > 500 -> 500 GB; CPU unchanged, so the CPU line gives 2.5.
    point = best_case(M5, 3, REFERENCE_SHAPE)
    assert point.cpus_per_gpu == pytest.approx(6.0)
    assert point.mem_gb_per_gpu == pytest.approx(500 / 3)
    assert point.speed == pytest.approx(2.5)
    assert point.capped


def test_best_case_memory_capped_at_proportional_cpu_does_not_divide_by_zero():
    # The reference raises here (ideal CPU == fair CPU); we keep the speed-up.
    profile = dataclasses.replace(profile_for("deepspeech"), best_mem_gb_per_gpu=187.5, speedup=1.5)
    point = best_case(profile, 4, REFERENCE_SHAPE)
    assert (point.cpus_per_gpu, point.mem_gb_per_gpu, point.speed) == (3.0, 125.0, 1.5)


def test_best_case_of_a_job_larger_than_a_server_is_proportional_with_speedup_one():
    point = best_case(RES18, 16, REFERENCE_SHAPE)  # 144 cores and 1000 GB exceed one server
    assert (point.cpus_per_gpu, point.mem_gb_per_gpu, point.speed) == (3.0, 62.5, 1.0)
    # ... but a dimension that does not exceed the server keeps its (small) demand.
    point = best_case(BERT, 16, REFERENCE_SHAPE)
    assert (point.cpus_per_gpu, point.mem_gb_per_gpu, point.speed) == (1.0, 20.0, 1.0)


def test_needs_downgrade_only_when_the_best_case_exceeds_proportional():
    assert needs_downgrade(best_case(RES18, 1, REFERENCE_SHAPE), REFERENCE_SHAPE)
    assert not needs_downgrade(best_case(BERT, 1, REFERENCE_SHAPE), REFERENCE_SHAPE)
    assert not needs_downgrade(best_case(profile_for("deepspeech"), 1, REFERENCE_SHAPE), REFERENCE_SHAPE)


def test_relative_speed_agrees_with_both_operating_points_and_the_matrix_between():
    assert relative_speed(RES18, 1, REFERENCE_SHAPE, 3, 62.5) == pytest.approx(1.0)
    assert relative_speed(RES18, 1, REFERENCE_SHAPE, 12, 125) == pytest.approx(2.4)  # covers best
    assert relative_speed(RES18, 1, REFERENCE_SHAPE, 6, 62.5) == pytest.approx(1.75)
    assert relative_speed(RES18, 1, REFERENCE_SHAPE, 2, 62.5) == pytest.approx(0.72)  # below proportional
    # A capped job at its capped point runs at the interpolated speed, never faster.
    assert relative_speed(ALEXNET, 4, REFERENCE_SHAPE, 6, 125) == pytest.approx(1 + 1.94 / 3)
    assert relative_speed(ALEXNET, 4, REFERENCE_SHAPE, 6, 62.5) == pytest.approx(1 + 1.94 / 3)


def test_relative_speed_is_relative_to_the_proportional_share_of_the_shape():
    shape = ServerShape(8, 32, 500)  # 4 cores per GPU; the models-4 set is profiled for it
    res18 = profile_for("res18", "models-4")
    assert relative_speed(res18, 1, shape, 4, 62.5) == pytest.approx(1.0)
    assert relative_speed(res18, 1, shape, 6, 62.5) == pytest.approx(1.75 / 1.3)
    assert relative_speed(res18, 1, shape, 9, 62.5) == pytest.approx(1.85)


def test_placement_penalty_applies_only_across_servers():
    profile = dataclasses.replace(RES18, placement_penalty=1.25)
    assert with_penalty(2.0, profile, 1, 8) == pytest.approx(2.0)
    assert with_penalty(2.0, profile, 2, 8) == pytest.approx(1.6)


def test_intermediate_points_walk_down_the_grid_fastest_first():
    points = intermediate_points(RES18, 1, REFERENCE_SHAPE)
    assert [(p.cpus_per_gpu, p.mem_gb_per_gpu) for p in points] == [(6, 62.5), (5, 62.5), (4, 62.5)]
    assert [p.speed for p in points] == pytest.approx([1.75, 1.53, 1.3])
    points = intermediate_points(M5, 1, REFERENCE_SHAPE)
    assert [(p.cpus_per_gpu, p.mem_gb_per_gpu, p.speed) for p in points] == [
        (6, 125, 2.0),
        (6, 62.5, 1.5),
        (5, 62.5, 1.4),
        (4, 62.5, 1.2),
    ]


def test_no_intermediate_points_without_a_speedup():
    assert intermediate_points(LSTM, 1, REFERENCE_SHAPE) == ()
    assert intermediate_points(RES18, 16, REFERENCE_SHAPE) == ()


def test_cluster_shape_is_the_reference_per_server_size():
    assert cluster_shape(make_cluster(3)) == REFERENCE_SHAPE
    mixed = make_cluster([make_server(8, 24, 500, server_id=0), make_server(4, 16, 250, server_id=1)])
    assert cluster_shape(mixed) == ServerShape(6, 20, 375)
    assert cluster_shape(make_cluster(0)) is None
