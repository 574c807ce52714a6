"""`{{ seconds|duration }}` ("42 s", "7 min", "3.2 h"), `{{ hours|duration:"h" }}`; `{{ s|iter_time }}`."""

from __future__ import annotations

from datetime import timedelta

from django import template

from scheduler_app.durations import MISSING, format_duration, format_iter_time

register = template.Library()

_SCALE_S = {"s": 1, "min": 60, "h": 3600, "d": 86400}


@register.filter
def duration(value: float | str | timedelta | None, unit: str = "s") -> str:
    """A number of `unit`s (s by default; min, h or d) or a timedelta, as format_duration writes it."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, timedelta):
        return format_duration(value)
    try:
        return format_duration(float(value) * _SCALE_S[unit])
    except (TypeError, ValueError, KeyError):
        return MISSING


@register.filter
def iter_time(value: float | None) -> str:
    """Seconds per iteration as format_iter_time writes them ("85.2 ms", "1.25 s")."""
    try:
        return format_iter_time(None if value is None or value == "" else float(value))
    except (TypeError, ValueError):
        return MISSING
