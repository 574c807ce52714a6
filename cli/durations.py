"""Time and size arguments as users type them: Slurm's durations, moments and sizes, ISO dates."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

# Standard library only, on purpose: this is the one parser of durations. The command line, the
# service's batch-script reader (scheduler_app/batch_script.py) and the web form all import it, so
# `-t 1-12:00` means the same wherever it is typed; and the command line must import without Django.

DURATION_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or 30m, 6h, 1h30m, 3h30, 2d)"
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SUFFIXED = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd])")
# Numbers with units, the last one's unit optional: "3h30" is 3h30m, "2d12" 2d12h, "5m30" 5m30s.
_ALL_SUFFIXED = re.compile(r"((?:[0-9]+(?:\.[0-9]+)?[smhd])+)([0-9]+)?")
_NEXT_UNIT = {"d": "h", "h": "m", "m": "s"}
_WHOLE = re.compile(r"[0-9]+")
# Far beyond any limit the service takes (365 days); it keeps a 400-digit number from overflowing a float.
_MAX_PARSED_S = 1e12
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([kmgt]?)b?")
_GB_PER_UNIT = {"k": 1 / 1024**2, "m": 1 / 1024, "g": 1.0, "t": 1024.0}


def parse_duration_s(text: str, *, option: str = "the duration", leave_out: str = "leave it out") -> float:
    """Seconds from Attune's "90s", "30m", "6h", "1h30m", "3h30" (a last number without a unit is in
    the unit below the one before it: minutes after hours), "1.5d", or Slurm's "MM", "MM:SS", "HH:MM:SS",
    "D-HH", "D-HH:MM", "D-HH:MM:SS" (as sbatch --time: a bare number is minutes; the leading field may
    be any size, 48:00:00, those after it stay within their unit).

    Raises ValueError naming `option` (e.g. "--time") and what was typed; for UNLIMITED or zero it says
    how to ask for no limit instead (`leave_out`, e.g. "leave the directive out")."""
    value = text.strip().lower()
    if value in ("unlimited", "infinite"):
        raise ValueError(f"{option}: Attune takes a finite limit; {leave_out} for none")
    suffixed = _ALL_SUFFIXED.fullmatch(value)
    if suffixed:
        parts = _SUFFIXED.findall(suffixed[1])
        seconds: float | None = sum(float(n) * _UNITS_S[unit] for n, unit in parts)
        if suffixed[2]:
            unit = _NEXT_UNIT.get(parts[-1][1])
            if unit is None:
                raise ValueError(f"{option}: {text.strip()!r}: a number after the seconds has no unit")
            seconds = (seconds or 0) + int(suffixed[2]) * _UNITS_S[unit]
    else:
        seconds = _slurm_time_s(value, option)
    if seconds is None:
        raise ValueError(f"{option} takes {DURATION_FORMATS}: {text.strip()!r} is not a duration")
    if seconds > _MAX_PARSED_S:
        raise ValueError(f"{option}: {text.strip()!r} is too long a duration")
    if seconds <= 0:
        raise ValueError(f"{option} needs a positive duration; {leave_out} for no limit")
    return float(seconds)


def parse_time_limit_s(text: str, *, option: str = "the time limit", leave_out: str = "leave it out") -> int:
    """A time limit in whole seconds (at least 1) from parse_duration_s's formats."""
    return max(1, round(parse_duration_s(text, option=option, leave_out=leave_out)))


def _slurm_time_s(value: str, option: str) -> int | None:
    """Seconds from Slurm's forms; None when `value` is not one of them."""
    days, dash, clock = value.rpartition("-")
    parts = clock.split(":")
    if (dash and not _WHOLE.fullmatch(days)) or len(parts) > 3 or not all(map(_WHOLE.fullmatch, parts)):
        return None
    numbers = [int(p) for p in parts]
    if dash:
        # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*numbers, 0, 0][:3]
        if hours > 23 or minutes > 59 or seconds > 59:
            raise ValueError(f"{option}: hours must be 0-23, minutes and seconds 0-59 after the days")
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    # MM, MM:SS, HH:MM:SS
    if any(n > 59 for n in numbers[1:]):
        raise ValueError(f"{option}: minutes and seconds after the first field must be 0-59")
    if len(numbers) == 1:
        return numbers[0] * 60
    if len(numbers) == 2:
        return numbers[0] * 60 + numbers[1]
    return numbers[0] * 3600 + numbers[1] * 60 + numbers[2]


def parse_moment(text: str, *, now: datetime | None = None, ahead: bool = True) -> datetime:
    """A moment as sbatch's --begin and --deadline take it, or an ISO date and time:
    "2026-11-23T18:00", "2026-11-23 18:00+01:00", "2026-11-23" (its midnight); "now", "now+90"
    (seconds), "now+2hours", "now+30min", "now+1h30m"; a time of day "18:00", "18:00:30", "6:00pm",
    "midnight", "noon", "fika" (15:00), "teatime" (16:00); "today" and "tomorrow" (their midnight);
    a date as Slurm writes it, "MMDD[YY]", "MM/DD[/YY]", "MM.DD[.YY]", each with "-HH:MM[:SS]" after it
    or not (its midnight). A time of day, or a date without its year, is its next coming (`ahead`, as
    Slurm reads it for a start or a deadline) or its last gone (not `ahead`: for --since and --start).
    Without an offset it is local time, as typed by someone at this machine. Raises ValueError
    otherwise."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        return moment if moment.tzinfo is not None else moment.astimezone()
    value = text.strip().lower()
    now = now if now is not None else datetime.now().astimezone()
    if value.startswith("now"):
        try:
            return now + timedelta(seconds=_after_now_s(text, value[3:].strip()))
        except OverflowError:  # past the year 9999
            raise ValueError(f"{text!r} is too far ahead") from None
    # Calendar days are counted on the local date, each moment given its own offset (a day across a
    # daylight-saving change is 23 or 25 hours long).
    today = now.astimezone().date()
    if value in ("today", "tomorrow"):
        return _local(today + timedelta(days=1 if value == "tomorrow" else 0))
    typed_date = _SLURM_DATE.fullmatch(value)
    if typed_date is not None:
        return _slurm_date(text, typed_date, now, today.year, ahead)
    clock = _clock_time(value)
    if clock is None:
        raise ValueError(f"{text!r} is not a date and time: {MOMENT_FORMATS}")
    moment = _local(today, *clock)
    if ahead and moment <= now:
        moment = _local(today + timedelta(days=1), *clock)
    elif not ahead and moment > now:
        moment = _local(today - timedelta(days=1), *clock)
    return moment


def _local(day: date, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    """That day's time of day in local time, with the offset in force then."""
    return datetime(day.year, day.month, day.day, hour, minute, second).astimezone()


def parse_deadline(text: str, *, now: datetime | None = None) -> datetime:
    """A deadline (parse_moment's forms; a time of day is its next coming). Raises ValueError otherwise."""
    return parse_moment(text, now=now, ahead=True)


MOMENT_FORMATS = (
    "use e.g. 2026-11-23T18:00 (local time), 18:00, now+2hours, now+1h30m, noon, midnight, tomorrow "
    "or 11/23-18:00"
)
_NAMED_CLOCK = {"midnight": (0, 0, 0), "noon": (12, 0, 0), "fika": (15, 0, 0), "teatime": (16, 0, 0)}
_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?\s*([ap]m)?")
# sbatch's now+COUNT[seconds|minutes|hours|days|weeks], its units' usual abbreviations beside them.
_COUNT_UNIT = re.compile(r"([0-9]+)\s*([a-z]*)")
_UNIT_WORDS_S = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86400),
}


def _after_now_s(text: str, rest: str) -> float:
    """Seconds after "now": "" (none), "+90" (seconds, as Slurm), "+2hours", "+30min", "+1h30m"."""
    if not rest:
        return 0.0
    if rest[0] != "+":
        raise ValueError(f"{text!r} is not a date and time: {MOMENT_FORMATS}")
    count = rest[1:].strip()
    match = _COUNT_UNIT.fullmatch(count)
    if match and match[2] in _UNIT_WORDS_S:
        seconds = int(match[1]) * _UNIT_WORDS_S[match[2]]
    elif _ALL_SUFFIXED.fullmatch(count):  # Attune's durations with units: 1h30m, 2d12h
        seconds = parse_duration_s(count, option="now+")
    else:
        raise ValueError(f"{text!r}: after now+ give a count and a unit, e.g. now+2hours or now+1h30m")
    if seconds > _MAX_PARSED_S:
        raise ValueError(f"{text!r} is too far ahead")
    return float(seconds)


# Slurm's dates: MMDD[YY], MM/DD[/YY] or MM.DD[.YY], then -HH:MM[:SS] or nothing (their midnight).
_SLURM_DATE = re.compile(
    r"(?:(?P<m4>[0-9]{2})(?P<d4>[0-9]{2})(?P<y4>[0-9]{2})?"
    r"|(?P<m>[0-9]{1,2})(?P<sep>[/.])(?P<d>[0-9]{1,2})(?:(?P=sep)(?P<y>[0-9]{2}))?)"
    r"(?:-(?P<clock>.+))?"
)


def _slurm_date(text: str, match: re.Match[str], now: datetime, this_year: int, ahead: bool) -> datetime:
    """A date in Slurm's forms (_SLURM_DATE's match). Without a year: this year's, or the next one's where
    it has passed (`ahead`), or the last one's where it is still to come (not `ahead`), as Slurm reads
    it. Local time with that date's own offset (a date past a daylight-saving change has the other)."""
    month = int(match["m4"] or match["m"])
    day = int(match["d4"] or match["d"])
    year_typed = match["y4"] or match["y"]
    hour = minute = second = 0
    if match["clock"] is not None:
        clock = _clock_time(match["clock"])
        if clock is None:
            raise ValueError(f"{text!r}: after the date's '-' give a time of day, e.g. 11/23-18:00")
        hour, minute, second = clock
    year = 2000 + int(year_typed) if year_typed else this_year

    def at(year: int) -> datetime:
        try:
            return _local(date(year, month, day), hour, minute, second)
        except ValueError:
            raise ValueError(f"{text!r}: no such date (month {month}, day {day}, year {year})") from None

    moment = at(year)
    if not year_typed:
        if ahead and moment <= now:
            moment = at(year + 1)
        elif not ahead and moment > now:
            moment = at(year - 1)
    return moment


def _clock_time(value: str) -> tuple[int, int, int] | None:
    """(hour, minute, second) of "18:00", "18:00:30", "6:00pm", "noon"...; None when not a time of day."""
    if value in _NAMED_CLOCK:
        return _NAMED_CLOCK[value]
    match = _CLOCK.fullmatch(value)
    if not match:
        return None
    hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
    if match[4]:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if match[4] == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    return hour, minute, second


def parse_mem_gb(text: str) -> float:
    """GB from Slurm's sizes: "16G", "512M", "1T", "4096" (megabytes, Slurm's default unit).
    Raises ValueError with what was typed otherwise."""
    match = _SIZE.fullmatch(text.strip().lower())
    if not match or not 0 < float(match[1]) < float("inf"):
        raise ValueError(f"{text!r} is not a memory size: use e.g. 16G, 512M or 4096 (megabytes)")
    return float(match[1]) * _GB_PER_UNIT[match[2] or "m"]


def parse_rate(text: str, *, option: str) -> float:
    """A positive, finite rate ("2.5" iterations per second). Raises ValueError naming the option."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(
            f"{option}: {text!r} is not a number: use e.g. 2.5 (iterations per second)"
        ) from None
    if not 0 < value < float("inf"):
        raise ValueError(
            f"{option}: the rate must be a positive number of iterations per second, got {text!r}"
        )
    return value
