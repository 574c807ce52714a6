"""The Philly-derived generator: statistics within tolerance, determinism, the reference's model order."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from profiles_app.catalog import WORKLOAD_CLASSES, load_catalog
from scheduler_app.simulator import philly_derived_trace, read_trace
from tests.reference_data import SYNERGY_TRACES

CATALOG = load_catalog()


def class_fractions(jobs) -> dict[str, float]:
    counts = Counter(WORKLOAD_CLASSES[j.model] for j in jobs)
    return {cls: counts[cls] / len(jobs) for cls in ("image", "language", "speech")}


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    assert philly_derived_trace(200, seed=3) == philly_derived_trace(200, seed=3)
    assert philly_derived_trace(200, seed=3) != philly_derived_trace(200, seed=4)


def test_poisson_arrival_rate() -> None:
    jobs = philly_derived_trace(5000, jobs_per_hour=9.0, seed=1)
    arrivals = np.array([j.arrival_s for j in jobs])
    gaps = np.diff(np.concatenate([[0.0], arrivals]))
    assert np.all(gaps >= 1) and np.all(gaps == np.round(gaps))  # whole seconds, as the reference
    # Mean gap 3600/9 = 400 s (+0.5 s from rounding up); exponential: std ~ mean.
    assert gaps.mean() == pytest.approx(400.5, rel=0.04)
    assert gaps.std() == pytest.approx(400.0, rel=0.06)


def test_overall_assignment_keeps_the_split_exactly() -> None:
    jobs = philly_derived_trace(1000, class_split=(20, 70, 10), seed=5)
    assert class_fractions(jobs) == pytest.approx({"image": 0.2, "language": 0.7, "speech": 0.1}, abs=0.002)
    jobs = philly_derived_trace(999, class_split=(33, 33, 33), seed=5)
    even = {"image": 1 / 3, "language": 1 / 3, "speech": 1 / 3}
    assert class_fractions(jobs) == pytest.approx(even, abs=0.002)
    assert class_fractions(philly_derived_trace(400, class_split=(50, 0, 50)))["language"] == 0.0


def test_random_assignment_split_within_tolerance() -> None:
    jobs = philly_derived_trace(6000, class_split=(20, 70, 10), seed=11, assignment="random")
    assert class_fractions(jobs) == pytest.approx({"image": 0.2, "language": 0.7, "speech": 0.1}, abs=0.02)


def test_multi_gpu_mix_within_tolerance() -> None:
    jobs = philly_derived_trace(6000, multi_gpu=True, seed=2)
    counts = Counter(j.num_gpus for j in jobs)
    assert set(counts) == {1, 2, 4, 8}
    fractions = {g: counts[g] / len(jobs) for g in (1, 2, 4, 8)}
    assert fractions == pytest.approx({1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}, abs=0.02)
    assert {j.num_gpus for j in philly_derived_trace(500, seed=2)} == {1}


def test_durations_follow_the_gavel_like_mix() -> None:
    jobs = philly_derived_trace(6000, seed=9)
    minutes = np.array([j.total_iters * CATALOG[j.model].iter_time_s / 60 for j in jobs])
    assert minutes.min() >= 10**1.5 * 0.99 and minutes.max() <= 10**4
    assert (minutes > 10**3).mean() == pytest.approx(0.2, abs=0.02)
    # Short jobs are log-uniform in 10^[1.5, 3] minutes: median 10^2.25.
    assert np.median(np.log10(minutes[minutes < 10**3])) == pytest.approx(2.25, abs=0.05)


def test_static_arrivals_are_milliseconds_apart() -> None:
    jobs = philly_derived_trace(500, static=True)
    assert [j.arrival_s for j in jobs[:3]] == [0.0, 0.001, 0.002]
    assert jobs[-1].arrival_s == 0.499


def test_model_sequence_matches_the_reference_generator() -> None:
    # The reference assigns models deterministically (class furthest below its share, round-robin inside
    # the class), so our sequence equals the one in the trace its own generator wrote.
    reference = read_trace(SYNERGY_TRACES / "philly1gpu_l9_n1000_s42.csv")
    ours = philly_derived_trace(1000, jobs_per_hour=9.0, class_split=(20, 70, 10), seed=42)
    assert [j.model for j in ours] == [j.model for j in reference]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_jobs"):
        philly_derived_trace(0)
    with pytest.raises(ValueError, match="jobs_per_hour"):
        philly_derived_trace(10, jobs_per_hour=0)
    with pytest.raises(ValueError, match="class_split"):
        philly_derived_trace(10, class_split=(0, 0, 0))
    with pytest.raises(ValueError, match="assignment"):
        philly_derived_trace(10, assignment="fair")  # type: ignore[arg-type]
