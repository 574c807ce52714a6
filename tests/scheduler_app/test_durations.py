"""format_duration and format_iter_time, readable durations (the browser test checks their JS twins)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.template import Context, Template

from scheduler_app.durations import MISSING, format_duration, format_iter_time

# (seconds, text): also the cases tests/browser/test_dashboards.py gives the JavaScript formatter.
CASES = [
    (0, "0 s"),
    (0.44, "0.4 s"),
    (4.25, "4.3 s"),  # half up, not Python's half to even
    (42, "42 s"),
    (59.4, "59 s"),
    (59.6, "1 min"),  # 60 s rounds into the next unit
    (420, "7 min"),
    (450, "7.5 min"),
    (3599, "1 h"),
    (3.2 * 3600, "3.2 h"),
    (15 * 3600, "15 h"),
    (2.1 * 86400, "2.1 d"),
    (400 * 86400, "400 d"),
    (-1800, "-30 min"),
    (-0.01, "0 s"),  # no "-0"
]


@pytest.mark.parametrize(("seconds", "text"), CASES)
def test_durations_read_in_the_largest_fitting_unit(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("value", [None, float("nan"), float("inf")])
def test_nothing_to_show_is_a_dash(value):
    assert format_duration(value) == MISSING


def test_a_timedelta_counts_as_its_seconds():
    assert format_duration(timedelta(hours=3, minutes=12)) == "3.2 h"


@pytest.mark.parametrize(
    ("template", "context", "text"),
    [
        ("{{ v|duration }}", {"v": 30}, "30 s"),
        ('{{ v|duration:"h" }}', {"v": 0.5}, "30 min"),
        ("{{ v|duration }}", {"v": timedelta(days=2)}, "2 d"),
        ("{{ v|duration }}", {"v": None}, MISSING),
        ("{{ v|duration }}", {"v": "not a number"}, MISSING),
    ],
)
def test_the_template_filter(template, context, text):
    assert Template("{% load durations %}" + template).render(Context(context)) == text


# (seconds per iteration, text): also given to the JavaScript twin by tests/browser/test_dashboards.py.
ITER_CASES = [
    (0.0852, "85.2 ms"),
    (0.1375, "138 ms"),
    (0.5, "500 ms"),
    (0.9996, "1 s"),  # 1000 ms reads as seconds
    (1.25, "1.25 s"),
    (12.0, "12 s"),
    (0.000123, "0.123 ms"),
    (0, MISSING),
    (-1, MISSING),
    (None, MISSING),
    (float("inf"), MISSING),
]


@pytest.mark.parametrize(("seconds", "text"), ITER_CASES)
def test_iteration_times_read_in_ms_below_a_second(seconds, text):
    assert format_iter_time(seconds) == text
    assert Template("{% load durations %}{{ s|iter_time }}").render(Context({"s": seconds})) == text
