"""jct_stats's mean and percentiles are numpy's, bit for bit, without numpy."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler_app.simulator.metrics import jct_stats


@pytest.mark.parametrize("seed", range(4))
def test_jct_stats_is_numpys_mean_and_percentiles(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [1, 2, 3, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 257, 1000, 4097, 8191, 8193, 12345]
    for n in sizes + [rng.randint(1, 20000) for _ in range(20)]:
        scale = rng.choice([1.0, 1e-3, 7.3, 1e4])
        jcts_s = [rng.uniform(0.0, 5e5) * scale for _ in range(n)]
        hours = np.asarray(jcts_s, dtype=float) / 3600.0
        p50, p99, p999 = np.percentile(hours, [50.0, 99.0, 99.9])
        stats = jct_stats(jcts_s)
        assert stats.count == n
        assert (stats.avg_h, stats.median_h, stats.p99_h, stats.p999_h) == (
            float(hours.mean()),
            float(p50),
            float(p99),
            float(p999),
        )
