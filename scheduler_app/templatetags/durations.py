"""`{{ seconds|duration }}` ("42 s", "7 min", "3.2 h", "2.1 d"); `{{ hours|duration:"h" }}` for hours."""

from __future__ import annotations

from datetime import timedelta

from django import template

from scheduler_app.durations import MISSING, format_duration

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
