"""Optimistic profiling (profiles_app/optimistic.py): the CPU search, the MinIO model, and the acceptance
test that it reproduces every cell of the catalog's matrices within 3 % from CPU points alone."""

from __future__ import annotations

import pytest

from profiles_app.catalog import load_catalog, load_profiling_inputs
from profiles_app.optimistic import (
    BELOW_WORKING_SET_TPUT,
    CPU_GRID,
    MEM_GRID,
    SEARCH_HALVING,
    DatasetSpec,
    NodeBandwidth,
    ProfilingError,
    best_case,
    cpu_search,
    derive_profile,
    epoch_seconds,
    interpolate_seconds,
    next_cpu_counts,
    per_gpu,
    profiling_seconds,
    relative_error,
    search_grid,
)
from scheduler_app.core.types import SensitivityProfile

ITERS_PER_POINT = 50  # Synergy profiles ~50 minibatches per point
ACCURACY = 0.03  # Synergy's claim: within 3 % of the measured matrix
JOB_MODELS = (
    "alexnet",
    "res18",
    "res50",
    "mobilenet",
    "shufflenet",
    "gnmt",
    "lstm",
    "transformer",
    "m5",
    "deepspeech",
)
# Not drawn by the reference's job generator (scheduler_app/simulator/workloads.py); checked all the same.
OTHER_MODELS = ("bert", "vae")


# ---------------------------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------------------------


def curve(values: dict[int, float]):
    """measure(c) for a throughput curve given at some core counts (seconds = 1 / throughput)."""
    return lambda c: 1.0 / values[c]


def test_bisection_measures_both_ends_then_splits_where_the_curve_moves():
    flat = {c: 1.0 for c in (1, 2, 3, 4, 5, 6, 9, 12, 24)}
    result = cpu_search(curve(flat), max_cpus=24)
    assert sorted(result.points) == [1, 24]
    assert result.runs == [24, 24, 1]  # the first point twice: the warm-up

    step = {1: 0.3, 2: 0.66, 3: 1.0, 4: 1.25, 5: 1.53, 6: 1.75, 9: 2.0, 12: 2.94, 24: 2.94}
    result = cpu_search(curve(step), max_cpus=24, warmup=False)
    assert sorted(result.points) == [1, 2, 3, 4, 5, 6, 9, 12, 24]
    assert next_cpu_counts(result.points, max_cpus=24) == []


def test_search_grid_stops_at_the_cores_held_and_scales_with_gpus():
    assert search_grid(12) == [1, 2, 3, 4, 5, 6, 9, 12]
    assert search_grid(10) == [1, 2, 3, 4, 5, 6, 9, 10]
    assert search_grid(2) == [1, 2]
    assert search_grid(24, num_gpus=2) == [2, 4, 6, 8, 10, 12, 18, 24]
    with pytest.raises(ProfilingError):
        search_grid(0)


def test_next_cpu_counts_is_a_pure_replay_of_the_points_so_far():
    assert next_cpu_counts({}, max_cpus=12) == [12, 1]
    assert next_cpu_counts({12: 1.0}, max_cpus=12) == [1]
    # Ends differ: the middle of [1 .. 12] is the 4th grid point (4 cores).
    assert next_cpu_counts({12: 1.0, 1: 3.0}, max_cpus=12) == [4]
    assert next_cpu_counts({12: 1.0, 1: 3.0, 4: 1.0}, max_cpus=12) == [2]  # [4, 12] is flat


def test_halving_follows_the_reference_rule():
    values = [0.3, 0.66, 1.0, 1.25, 1.53, 1.75] + [2.0] * 5 + [2.94] * 13
    step = dict(zip(range(1, 25), values, strict=True))
    result = cpu_search(curve(step), max_cpus=24, strategy=SEARCH_HALVING, warmup=False)
    # 24 first, halved (the first point always halves); 12 is within 10 %: halve; 6 is not: step down.
    assert list(result.points) == [24, 12, 6, 5, 4, 3, 2, 1]


def test_interpolation_is_linear_in_throughput_and_flat_outside():
    points = {1.0: 1.0, 3.0: 0.5}  # 1 and 2 iterations/s
    assert interpolate_seconds(points, 2.0) == pytest.approx(1 / 1.5)
    assert interpolate_seconds(points, 0.5) == 1.0
    assert interpolate_seconds(points, 24.0) == 0.5


def test_minio_epoch_is_the_slower_of_compute_and_reading():
    data = DatasetSpec(dataset_gb=100.0, samples=1000, samples_per_iter=10)
    node = NodeBandwidth(mem_gbps=10.0, disk_mbps=100.0)
    # 40 GB cached: 4 s from memory + 60 GB x 1024 / 100 MB/s = 614.4 s from storage.
    assert epoch_seconds(10.0, 40.0, dataset=data, node=node) == pytest.approx(4 + 614.4)
    assert epoch_seconds(700.0, 40.0, dataset=data, node=node) == 700.0
    assert epoch_seconds(10.0, 200.0, dataset=data, node=node) == 10.0  # all cached: 10 s either way
    assert epoch_seconds(10.0, 0.0, dataset=DatasetSpec(0, 1, 1), node=node) == 10.0


def test_derived_profile_is_normalised_to_the_proportional_point():
    points = {1.0: 3.0, 3.0: 1.0, 6.0: 0.5, 24.0: 0.5}
    data = DatasetSpec(dataset_gb=0, samples=100, samples_per_iter=1, working_set_gb=30)
    derived = derive_profile(points, dataset=data, node=NodeBandwidth(10, 100))
    assert derived.tput[CPU_GRID.index(3)][MEM_GRID.index(62.5)] == 1.0
    assert derived.tput[CPU_GRID.index(24)][MEM_GRID.index(250)] == 2.0
    assert all(row[0] == BELOW_WORKING_SET_TPUT for row in derived.tput)  # 20.83 GB < 30 GB working set
    assert (derived.best_cpus_per_gpu, derived.best_mem_gb_per_gpu, derived.speedup) == (6.0, 62.5, 2.0)
    assert derived.iter_time_s == pytest.approx(1.0)
    with pytest.raises(ProfilingError):
        derive_profile({}, dataset=data, node=NodeBandwidth(10, 100))


def test_best_case_takes_fewest_cores_then_least_memory_within_tolerance():
    tput = [[1.0, 1.0], [1.99, 2.0], [2.0, 2.0]]
    assert best_case(tput, [1, 2, 3], [10, 20], tol=0.0) == (2.0, 20.0, 2.0)
    assert best_case(tput, [1, 2, 3], [10, 20], tol=0.03) == (2.0, 10.0, 1.99)


# ---------------------------------------------------------------------------------------------------
# Acceptance: simulated profiling against the catalog
# ---------------------------------------------------------------------------------------------------


def full_memory_seconds(profile: SensitivityProfile):
    """The simulated measurement: seconds per iteration at `c` cores with the dataset cached (the
    catalog's full-memory column), linear in throughput between the catalog's CPU grid points."""
    grid = profile.cpu_per_gpu_grid
    full = {c: profile.iter_time_s / row[-1] for c, row in zip(grid, profile.tput, strict=True)}

    def measure(cpus: int) -> float:
        return interpolate_seconds(full, float(cpus))

    return measure


def simulate(model: str, *, strategy: str = "bisection", datasets=None):
    profile = load_catalog()[model]
    node, catalog_datasets = load_profiling_inputs()
    dataset = (datasets or catalog_datasets)[model]
    measure = full_memory_seconds(profile)
    search = cpu_search(measure, max_cpus=24, strategy=strategy)
    derived = derive_profile(
        per_gpu(search.points, 1),
        dataset=dataset,
        node=node,
        cpu_grid=profile.cpu_per_gpu_grid,
        mem_grid=profile.mem_gb_per_gpu_grid,
    )
    errors = [
        [relative_error(d, t) for d, t in zip(drow, trow, strict=True)]
        for drow, trow in zip(derived.tput, profile.tput, strict=True)
    ]
    optimistic_s = profiling_seconds(search.runs, measure, iters_per_point=ITERS_PER_POINT)
    exhaustive_s = sum(
        ITERS_PER_POINT * profile.iter_time_s / v for row in profile.tput for v in row if v > 0
    )
    return profile, search, derived, errors, optimistic_s, exhaustive_s


def test_optimistic_profiling_reproduces_every_catalog_cell_within_3_percent(capsys):
    lines = [
        "",
        f"Optimistic profiling vs the catalog ({ITERS_PER_POINT} iterations per point, warm-up included; "
        "exhaustive = all 45 cells):",
        f"{'model':<12}{'points':>7}{'runs':>6}{'max err':>9}  {'best (cpu, GB, x)':<22}"
        f"{'profiling s':>12}{'exhaustive s':>14}{'saved':>7}",
    ]
    failures = []
    total_opt = total_exh = 0.0
    for model in (*JOB_MODELS, *OTHER_MODELS):
        profile, search, derived, errors, opt_s, exh_s = simulate(model)
        worst = max(max(row) for row in errors)
        total_opt, total_exh = total_opt + opt_s, total_exh + exh_s
        for i, row in enumerate(errors):
            for j, err in enumerate(row):
                if err > ACCURACY:
                    failures.append(
                        f"{model} ({profile.cpu_per_gpu_grid[i]:g} cores, "
                        f"{profile.mem_gb_per_gpu_grid[j]:g} GB): derived {derived.tput[i][j]:.3f}, "
                        f"catalog {profile.tput[i][j]:.3f}"
                    )
        assert search.num_points <= 9, model
        # The derived best case is the catalog's (which rounds 20.83 GB to 20), its speed-up within 3 %.
        assert derived.best_cpus_per_gpu == profile.best_cpus_per_gpu, model
        assert derived.best_mem_gb_per_gpu == pytest.approx(profile.best_mem_gb_per_gpu, abs=1.0), model
        assert relative_error(derived.speedup, profile.speedup) <= ACCURACY, model
        best = f"({derived.best_cpus_per_gpu:g}, {derived.best_mem_gb_per_gpu:g}, {derived.speedup:.2f})"
        lines.append(
            f"{model:<12}{search.num_points:>7}{len(search.runs):>6}{worst:>8.2%}  {best:<22}"
            f"{opt_s:>12.0f}{exh_s:>14.0f}{exh_s / opt_s:>6.1f}x"
        )
    lines.append(
        f"{'all':<12}{'':>7}{'':>6}{'':>9}  {'':<22}{total_opt:>12.0f}{total_exh:>14.0f}"
        f"{total_exh / total_opt:>6.1f}x"
    )
    with capsys.disabled():
        print("\n".join(lines))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("model", JOB_MODELS)
def test_at_most_nine_cpu_points_and_fewer_for_flat_models(model):
    _profile, search, *_ = simulate(model)
    assert search.num_points <= 9
    if model in ("gnmt", "lstm", "transformer"):
        assert search.num_points == 2


def test_the_reference_halving_rule_misses_alexnets_nine_core_step():
    """Why the search bisects the grid: halving from 24 never measures 9 cores, and interpolating
    AlexNet's 6 -> 12 core step there overshoots the catalog's 2.0 by far more than 3 %."""
    profile, search, _derived, errors, *_ = simulate("alexnet", strategy=SEARCH_HALVING)
    assert 9 not in search.points
    i = profile.cpu_per_gpu_grid.index(9)
    assert errors[i][-1] > 0.10


def test_minio_alone_cannot_make_the_catalogs_lowest_memory_column():
    """The 20.83 GB column (0.1 for every image and speech model at every core count) comes from the
    working-set floor: with ImageNet cached to 20.83 GB and read at 100 MB/s, MinIO predicts ~1.3x."""
    _node, datasets = load_profiling_inputs()
    no_floor = {**datasets, "alexnet": DatasetSpec(137.0, 1281167, 512, working_set_gb=0.0)}
    _profile, _search, derived, errors, *_ = simulate("alexnet", datasets=no_floor)
    assert derived.tput[-1][0] > 1.0
    assert max(row[0] for row in errors) > 1.0
