"""Durations, deadlines and memory sizes as users type them (Slurm's formats too).

cli/durations.py is the one parser of durations: the batch-script reader and the web form call it too.
"""

import time
from datetime import UTC, datetime, timedelta

import pytest

from cli.durations import parse_deadline, parse_duration_s, parse_mem_gb, parse_moment, parse_time_limit_s
from cli.job_history import since_time


@pytest.mark.parametrize(
    ("typed", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1.5d", 129600),
        ("45", 2700),  # Slurm: bare minutes
        ("10:30", 630),  # MM:SS
        ("02:00:00", 7200),  # HH:MM:SS
        ("1-12", 129600),  # D-HH
        ("1-12:30", 131400),  # D-HH:MM
        ("2-00:00:10", 172810),  # D-HH:MM:SS
        ("90:00", 5400),  # the first field may be any size
        ("48:00:00", 172800),
        ("1-0", 86400),
        (" 2H ", 7200),
        ("2d", 172800),
        ("3h30", 12600),  # a last number without a unit is in the unit below: 3h30m
        ("2d12", 216000),  # 2 days 12 hours
        ("5m30", 330),  # 5 minutes 30 seconds
        ("1h30m15", 5415),
        ("1-0:30", 88200),  # D-HH:MM
        ("0:45", 45),  # MM:SS
    ],
)
def test_durations(typed, seconds):
    assert parse_duration_s(typed) == seconds


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        (
            "soon",
            "--time takes MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or 30m, 6h, 1h30m, 3h30, 2d): "
            "'soon' is not a duration",
        ),
        ("", "--time takes MM"),
        ("1x", "'1x' is not a duration"),
        ("30s5", "--time: '30s5': a number after the seconds has no unit"),
        ("3h30x", "'3h30x' is not a duration"),
        ("-5m", "'-5m' is not a duration"),
        ("1:2:3:4", "'1:2:3:4' is not a duration"),
        ("a-10:00", "'a-10:00' is not a duration"),
        ("\uff11\uff10", "is not a duration"),  # full-width digits: str.isdigit() says yes
        ("0m", "--time needs a positive duration; leave it out for no limit"),
        ("0", "--time needs a positive duration"),
        ("UNLIMITED", "--time: Attune takes a finite limit; leave it out for none"),
        ("1:60", "--time: minutes and seconds after the first field must be 0-59"),
        ("1-24", "--time: hours must be 0-23, minutes and seconds 0-59 after the days"),
        ("1-00:60", "0-59 after the days"),
        ("9" * 400 + "d", "is too long a duration"),
        ("9" * 400, "is too long a duration"),
    ],
)
def test_what_is_not_a_duration_is_refused_naming_the_option_and_what_was_typed(typed, message):
    with pytest.raises(ValueError) as refused:
        parse_duration_s(typed, option="--time")
    assert message in str(refused.value)


def test_a_time_limit_is_whole_seconds_at_least_one():
    assert parse_time_limit_s("1-12:00") == 129600 and parse_time_limit_s("0.001s") == 1
    assert parse_time_limit_s("1.5m") == 90 and isinstance(parse_time_limit_s("30"), int)
    with pytest.raises(ValueError, match="leave the field empty for none"):
        parse_time_limit_s("infinite", leave_out="leave the field empty")


def test_deadlines_without_an_offset_are_local_time():
    assert parse_deadline("2026-11-23T18:00+00:00") == datetime(2026, 11, 23, 18, 0, tzinfo=UTC)
    local = parse_deadline("2026-11-23 18:00")
    assert local.tzinfo is not None and (local.hour, local.minute) == (18, 0)
    with pytest.raises(ValueError, match="not a date and time"):
        parse_deadline("yesterday")


# Monday 2026-11-30 20:15, local time: what a user at this machine typing sbatch's forms means.
NOW = datetime(2026, 11, 30, 20, 15).astimezone()


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("now", datetime(2026, 11, 30, 20, 15)),
        ("now+90", datetime(2026, 11, 30, 20, 16, 30)),  # Slurm: a bare count is seconds
        ("now+2hours", datetime(2026, 11, 30, 22, 15)),
        ("now + 30 min", datetime(2026, 11, 30, 20, 45)),
        ("NOW+1week", datetime(2026, 12, 7, 20, 15)),
        ("now+1h30m", datetime(2026, 11, 30, 21, 45)),  # Attune's durations with units
        ("21:00", datetime(2026, 11, 30, 21, 0)),  # later today
        ("18:00", datetime(2026, 12, 1, 18, 0)),  # gone today: tomorrow's
        ("20:15", datetime(2026, 12, 1, 20, 15)),  # now is not ahead
        ("6:30pm", datetime(2026, 12, 1, 18, 30)),
        ("12:00am", datetime(2026, 12, 1, 0, 0)),
        ("noon", datetime(2026, 12, 1, 12, 0)),
        ("midnight", datetime(2026, 12, 1, 0, 0)),
        ("teatime", datetime(2026, 12, 1, 16, 0)),
        ("tomorrow", datetime(2026, 12, 1, 0, 0)),
        ("today", datetime(2026, 11, 30, 0, 0)),
        ("2026-12-02", datetime(2026, 12, 2, 0, 0)),
        ("2026-12-02t08:00", datetime(2026, 12, 2, 8, 0)),
        # Slurm's dates: without a year this year's, or next year's where it has passed
        ("12/02", datetime(2026, 12, 2, 0, 0)),
        ("12/2-18:00", datetime(2026, 12, 2, 18, 0)),
        ("1202", datetime(2026, 12, 2, 0, 0)),
        ("1202-6:30pm", datetime(2026, 12, 2, 18, 30)),
        ("12.02.27", datetime(2027, 12, 2, 0, 0)),
        ("120227-08:00:30", datetime(2027, 12, 2, 8, 0, 30)),
        ("11/30-21:00", datetime(2026, 11, 30, 21, 0)),  # later today
        ("11/30", datetime(2027, 11, 30, 0, 0)),  # its midnight has passed: next year's
        ("01/15", datetime(2027, 1, 15, 0, 0)),
    ],
)
def test_deadlines_in_sbatchs_forms_are_local_times_ahead(typed, expected):
    assert parse_deadline(typed, now=NOW) == expected.astimezone()


def test_a_time_of_day_for_since_or_start_is_its_last_one():
    assert parse_moment("21:00", now=NOW, ahead=False) == datetime(2026, 11, 29, 21, 0).astimezone()
    assert parse_moment("09:00", now=NOW, ahead=False) == datetime(2026, 11, 30, 9, 0).astimezone()
    assert since_time("today", now=NOW) == datetime(2026, 11, 30, 0, 0).astimezone()
    assert parse_moment("12/02", now=NOW, ahead=False) == datetime(2025, 12, 2, 0, 0).astimezone()
    assert parse_moment("11/30-08:00", now=NOW, ahead=False) == datetime(2026, 11, 30, 8, 0).astimezone()
    assert since_time("12h", now=NOW) == NOW - timedelta(hours=12)


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("now+2 fortnights", "after now\\+ give a count and a unit"),
        ("now+", "after now\\+ give a count and a unit"),
        ("now-1h", "not a date and time"),
        ("now+999999999999", "too far ahead"),
        ("25:00", "not a date and time"),
        ("13:00pm", "not a date and time"),
        ("18:60", "not a date and time"),
        ("", "not a date and time"),
        ("02/30", "no such date"),
        ("1302", "no such date"),
        ("12/02-25:00", "after the date's '-' give a time of day"),
        ("12/02.27", "not a date and time"),  # separators mixed
        ("12/02/2027", "not a date and time"),  # Slurm's year has two digits; ISO takes four
    ],
)
def test_what_is_not_a_moment_is_refused_with_the_forms_taken(typed, message):
    with pytest.raises(ValueError, match=message):
        parse_deadline(typed, now=NOW)


@pytest.mark.parametrize(
    ("typed", "gb"),
    [("16G", 16.0), ("16g", 16.0), ("512M", 0.5), ("4096", 4.0), ("1T", 1024.0), ("1048576K", 1.0)],
)
def test_memory_sizes_in_slurms_units_megabytes_by_default(typed, gb):
    assert parse_mem_gb(typed) == gb


@pytest.mark.parametrize("typed", ["", "lots", "0", "0G", "-1G", "16X", "G"])
def test_what_is_not_a_memory_size_is_refused(typed):
    with pytest.raises(ValueError, match="not a memory size"):
        parse_mem_gb(typed)


def test_dates_and_times_of_day_past_a_daylight_saving_change_have_their_own_offset(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Stockholm")
    time.tzset()
    try:
        winter = datetime(2026, 11, 30, 20, 15).astimezone()
        summer = parse_deadline("07/01-12:00", now=winter)
        assert (summer.year, summer.month, summer.day, summer.hour) == (2027, 7, 1, 12)
        assert summer.utcoffset() == timedelta(hours=2) and winter.utcoffset() == timedelta(hours=1)
        # The night the clocks go back (2026-10-25): tomorrow's 18:00 and midnight are local ones.
        before = datetime(2026, 10, 24, 20, 15).astimezone()
        evening = parse_deadline("18:00", now=before)
        assert (evening.day, evening.hour, evening.utcoffset()) == (25, 18, timedelta(hours=1))
        assert parse_deadline("tomorrow", now=before).utcoffset() == timedelta(hours=2)
        assert parse_deadline("18:00", now=before) - before == timedelta(hours=22, minutes=45)
    finally:
        monkeypatch.undo()
        time.tzset()
