"""Time and size arguments as users type them: Slurm's time formats and sizes, ISO deadlines."""

from __future__ import annotations

import re
from datetime import datetime

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_ALL_SUFFIXED = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+")
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([kmgt]?)b?")
_GB_PER_UNIT = {"k": 1 / 1024**2, "m": 1 / 1024, "g": 1.0, "t": 1024.0}


def parse_duration_s(text: str) -> float:
    """Seconds from "90s", "30m", "2h", "1h30m", "1.5d", or Slurm's "MM", "MM:SS", "HH:MM:SS",
    "D-HH", "D-HH:MM", "D-HH:MM:SS". Raises ValueError with what was typed otherwise."""
    value = text.strip().lower()
    if not value:
        raise ValueError("an empty duration")
    if _ALL_SUFFIXED.fullmatch(value):
        seconds = sum(float(n) * _UNITS_S[unit] for n, unit in _SUFFIXED.findall(value))
    else:
        seconds = _slurm_duration_s(value, text)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


def _slurm_duration_s(value: str, text: str) -> float:
    days, _, clock = value.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or (days and not days.isdigit()) or len(parts) > 3:
        raise ValueError(f"{text!r} is not a duration: use 30m, 2h, 1h30m or Slurm's [D-]HH:MM:SS")
    numbers = [int(p) for p in parts]
    if days:
        # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*numbers, 0, 0][:3]
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    # MM, MM:SS, HH:MM:SS
    if len(numbers) == 1:
        return numbers[0] * 60
    if len(numbers) == 2:
        return numbers[0] * 60 + numbers[1]
    return numbers[0] * 3600 + numbers[1] * 60 + numbers[2]


def parse_deadline(text: str) -> datetime:
    """An ISO date and time ("2026-11-23T18:00", "2026-11-23 18:00+01:00"); without an offset it is
    local time, as typed by someone at this machine. Raises ValueError otherwise."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a date and time: use e.g. 2026-11-23T18:00") from None
    return moment if moment.tzinfo is not None else moment.astimezone()


def parse_mem_gb(text: str) -> float:
    """GB from Slurm's sizes: "16G", "512M", "1T", "4096" (megabytes, Slurm's default unit).
    Raises ValueError with what was typed otherwise."""
    match = _SIZE.fullmatch(text.strip().lower())
    if not match or not 0 < float(match[1]) < float("inf"):
        raise ValueError(f"{text!r} is not a memory size: use e.g. 16G, 512M or 4096 (megabytes)")
    return float(match[1]) * _GB_PER_UNIT[match[2] or "m"]
