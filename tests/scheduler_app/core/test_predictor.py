"""GENIE predictor: hand-checked formulas, and held-out accuracy on a synthetic noisy workload."""

from __future__ import annotations

import math
import random

import pytest

from scheduler_app.core.predictor import (
    PENALTY_MAX,
    Predictor,
    ProfileSample,
    fit_placement_penalty,
    fit_predictor,
    response_latency_s,
)

# Ground truth of the synthetic workload (a ResNet-like CNN on PCIe servers with a 10-25 Gb/s NIC).
TRUTH = Predictor(alpha=0.002, beta=0.05, t_intra=0.03, t_cross=0.08, startup_s=30.0)
NOISE = 0.03  # +-3 % multiplicative noise on every measured configuration


def measure(rng: random.Random, n: int, k: int, b: float) -> ProfileSample:
    t = TRUTH.iter_time_s(n, k, b) * (1.0 + rng.uniform(-NOISE, NOISE))
    return ProfileSample(n, k, b, t)


def lightweight_profile(rng: random.Random) -> list[ProfileSample]:
    """GENIE's lightweight profile: 1 GPU at 3 batch sizes, a 2-GPU one-server run, a 2-server run."""
    return [
        measure(rng, 1, 1, 32),
        measure(rng, 1, 1, 64),
        measure(rng, 1, 1, 128),
        measure(rng, 1, 2, 64),
        measure(rng, 2, 1, 64),
    ]


HELD_OUT = [
    (1, 1, 16),
    (1, 1, 256),
    (1, 4, 64),
    (1, 8, 32),
    (1, 8, 256),
    (2, 4, 64),
    (2, 8, 128),
    (4, 1, 64),
    (4, 2, 32),
    (4, 8, 256),
]


def test_formula_hand_checked():
    p = Predictor(alpha=0.01, beta=0.1, t_intra=0.05, t_cross=0.2, startup_s=5.0)
    # 2 servers x 4 GPUs, b=10: 0.1 + 0.1 + ceil(log2 4)=2 x 0.05 + log2 2=1 x 0.2 = 0.5 s
    assert p.iter_time_s(2, 4, 10) == pytest.approx(0.5)
    # 3 GPUs on a server: ceil(log2 3) = 2 steps
    assert p.iter_time_s(1, 3, 10) == pytest.approx(0.3)
    # Synergy factor 2 halves the time
    assert p.iter_time_s(2, 4, 10, speedup=2.0) == pytest.approx(0.25)
    # R = 2*4*10 / 0.5 = 160 samples/s; E = 1600/160 + 5 = 15 s
    assert p.rate(2, 4, 10) == pytest.approx(160.0)
    assert p.execution_time_s(1600, 2, 4, 10) == pytest.approx(15.0)
    assert response_latency_s(7.0, 15.0) == 22.0
    with pytest.raises(ValueError):
        p.iter_time_s(0, 1, 10)


def test_exact_fit_recovers_coefficients():
    samples = [
        ProfileSample(n, k, b, TRUTH.iter_time_s(n, k, b))
        for n, k, b in [(1, 1, 32), (1, 1, 128), (1, 2, 64), (2, 1, 64)]
    ]
    fit = fit_predictor(samples, startup_s=30.0)
    p = fit.predictor
    assert (p.alpha, p.beta, p.t_intra, p.t_cross) == pytest.approx((0.002, 0.05, 0.03, 0.08))
    assert fit.r2 == pytest.approx(1.0) and fit.r2_compute == pytest.approx(1.0)
    assert fit.has_intra and fit.has_cross and fit.samples == 4


def test_fit_needs_two_batch_sizes_and_defaults_missing_terms():
    with pytest.raises(ValueError, match="two or more"):
        fit_predictor([ProfileSample(1, 1, 32, 0.1), ProfileSample(1, 1, 32, 0.11)])
    fit = fit_predictor([ProfileSample(1, 1, 32, 0.114), ProfileSample(1, 1, 64, 0.178)])
    assert not fit.has_intra and not fit.has_cross
    assert fit.predictor.t_intra == 0.0 and fit.predictor.t_cross == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_held_out_configurations_within_10_percent(seed):
    """Issue acceptance: fitted from its lightweight profile, the predictor predicts held-out
    configurations (other batch sizes, 4 and 8 GPUs, 2 and 4 servers) of the noisy synthetic
    workload within 10 %."""
    rng = random.Random(seed)
    fit = fit_predictor(lightweight_profile(rng), startup_s=30.0)
    assert fit.r2 > 0.9
    for n, k, b in HELD_OUT:
        observed = measure(rng, n, k, b).iter_time_s
        predicted = fit.predictor.iter_time_s(n, k, b)
        assert abs(predicted - observed) / observed < 0.10, (seed, n, k, b, predicted, observed)
        # Execution time of 1e6 samples follows the same relative error (startup aside).
        e_true = TRUTH.execution_time_s(1e6, n, k, b)
        e_pred = fit.predictor.execution_time_s(1e6, n, k, b)
        assert abs(e_pred - e_true) / e_true < 0.10
    assert math.isfinite(fit.predictor.rate(4, 8, 256))


def test_placement_penalty_is_the_ratio_of_the_median_one_server_and_spread_speeds():
    # The profile overstates every lease by 20 % (ratios near 0.8); spreading costs a further 1.25x.
    single = [0.8, 0.82, 0.78, 0.8, 0.5]  # one lease behind a noisy neighbour: the median ignores it
    spread = [0.64, 0.6, 0.66, 0.64]
    assert fit_placement_penalty(single, spread) == pytest.approx(0.8 / 0.64)


def test_placement_penalty_needs_three_leases_of_each_kind():
    assert fit_placement_penalty([1.0] * 10, [0.5, 0.5]) is None
    assert fit_placement_penalty([1.0, 1.0], [0.5] * 10) is None
    assert fit_placement_penalty([1.0, 1.0, 1.0], [0.5, 0.5, 0.0, -1.0]) is None  # no speed: not a lease
    assert fit_placement_penalty([1.0] * 3, [0.5] * 3) == pytest.approx(2.0)


def test_placement_penalty_stays_within_one_and_its_maximum():
    assert fit_placement_penalty([1.0] * 3, [1.1] * 3) == 1.0  # spread faster: noise, not a speed-up
    assert fit_placement_penalty([1.0] * 3, [0.001] * 3) == PENALTY_MAX  # a broken network
