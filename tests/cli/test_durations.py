"""Durations, deadlines and memory sizes as users type them (Slurm's formats too)."""

from datetime import UTC, datetime

import pytest

from cli.durations import parse_deadline, parse_duration_s, parse_mem_gb


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
        (" 2H ", 7200),
    ],
)
def test_durations(typed, seconds):
    assert parse_duration_s(typed) == seconds


@pytest.mark.parametrize("typed", ["", "soon", "1x", "-5m", "1:2:3:4", "a-10:00", "0m", "0"])
def test_what_is_not_a_duration_is_refused_with_what_was_typed(typed):
    with pytest.raises(ValueError, match="duration"):
        parse_duration_s(typed)


def test_deadlines_without_an_offset_are_local_time():
    assert parse_deadline("2026-11-23T18:00+00:00") == datetime(2026, 11, 23, 18, 0, tzinfo=UTC)
    local = parse_deadline("2026-11-23 18:00")
    assert local.tzinfo is not None and (local.hour, local.minute) == (18, 0)
    with pytest.raises(ValueError, match="not a date and time"):
        parse_deadline("tomorrow")


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
