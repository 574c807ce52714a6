"""bench.forecast_refresh's own arithmetic: two refreshes' estimates compared, the CPU per round interval."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench.forecast_refresh import cpu_per_interval, differences, intervals_spanned, without_finish
from scheduler_app.services.forecasts import Estimate

T0 = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def test_two_refreshes_differ_by_each_job_whose_start_finish_or_detail_differs() -> None:
    a = {1: Estimate(T0, T1), 2: Estimate(T0, None, "not finished"), 3: Estimate(None, None, "held")}
    assert differences(a, dict(a)) == 0
    b = {**a, 1: Estimate(T0, T0), 2: Estimate(T0, None, "other")}
    assert differences(a, b) == 2
    assert differences(a, {1: a[1], 2: a[2]}) == 1  # a job one of them left out
    assert differences(a, {**a, 3: Estimate(None, None, "held", cut_short=True)}) == 0  # not shown


def test_a_cut_refresh_counts_the_jobs_it_left_without_the_whole_forecasts_finish() -> None:
    whole = {1: Estimate(T0, T1), 2: Estimate(T0, T1), 3: Estimate(T0, None, "not finished within 168 h")}
    cut = {1: Estimate(T0, T1), 2: Estimate(T0, None, "not finished within 5 s of forecasting")}
    assert without_finish(cut, whole) == 1  # job 3 has none in either
    assert without_finish({}, whole) == 2
    assert without_finish(whole, whole) == 0


def test_the_cpu_of_each_round_interval_counts_each_part_where_it_started() -> None:
    parts = [(6000.0, 0.4), (6030.0, 0.35), (6059.9, 0.2), (6125.0, 0.3)]  # 6060-6119: none
    assert cpu_per_interval(parts, 60.0) == pytest.approx([0.95, 0.0, 0.3])
    assert intervals_spanned(6030.0, 6125.0, 60.0) == 3
    assert intervals_spanned(6000.0, 6059.0, 60.0) == 1
