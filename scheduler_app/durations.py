"""Durations as people read them: "42 s", "7 min", "3.2 h", "2.1 d" (parsing is cli/durations.py's).

The dashboards' charts format client-side with formatDuration in static/dashboards/dashboards.js,
the same rules line for line (round half up, one decimal below 10, whole numbers above); the browser
test checks that both give the same text for the same seconds.
"""

from __future__ import annotations

import math
from datetime import timedelta

# (seconds per unit, unit, the value at which the next unit takes over)
_UNITS = ((1, "s", 60), (60, "min", 60), (3600, "h", 24), (86400, "d", math.inf))
MISSING = "\u2013"  # an en dash, as the dashboards show a missing value


def _rounded(value: float) -> float:
    """Half up (as JavaScript's Math.round, not Python's half-even): 1 decimal below 10, else whole."""
    if value < 10:
        return math.floor(value * 10 + 0.5) / 10
    return float(math.floor(value + 0.5))


def format_duration(seconds: float | timedelta | None) -> str:
    """`seconds` in the largest unit in which it is at least 1 (s, min, h, d); negative keeps its sign.

    None, NaN and infinities give MISSING (the dash the dashboards show for "nothing to show").
    """
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if seconds is None or not math.isfinite(seconds):
        return MISSING
    sign, size = ("-" if seconds < 0 else ""), abs(seconds)
    for unit_s, unit, next_at in _UNITS:
        value = _rounded(size / unit_s)
        # The unit whose rounded value stays below the next unit's threshold (59.96 s is "1 min").
        if value < next_at:
            text = str(int(value)) if value == int(value) else str(value)
            return f"{sign if value else ''}{text} {unit}"
    raise AssertionError("unreachable: the last unit has no upper bound")


def _significant(value: float) -> str:
    """Three significant digits (whole numbers from 100 up), without trailing zeros: "12.3", "0.5", "250"."""
    if value >= 100:
        return str(math.floor(value + 0.5))
    return f"{value:.3g}"


def format_iter_time(seconds: float | None) -> str:
    """Seconds per iteration to three significant digits, in ms below a second: "85.2 ms", "1.25 s".

    None, non-finite and non-positive values give MISSING. formatIterTime in dashboards.js matches it.
    """
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return MISSING
    ms = _significant(seconds * 1000)
    return f"{ms} ms" if float(ms) < 1000 else f"{_significant(seconds)} s"
