"""How the command line prints: local times, aligned tables, lists of choices."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

MAX_CHOICES_SHOWN = 20


def instant(value: str) -> datetime:
    """An API timestamp (ISO 8601, "Z" for UTC) as an aware datetime."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def when(value: str | None) -> str:
    """An API timestamp as local "YYYY-MM-DD HH:MM"; "-" when there is none."""
    if not value:
        return "-"
    return instant(value).astimezone().strftime("%Y-%m-%d %H:%M")


def table(rows: list[list[str]], out: TextIO) -> None:
    """Rows (the header first) in left-aligned columns two spaces apart, as squeue prints them."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")


def choices_text(names: list[str]) -> str:
    """ "a, b, c", cut after MAX_CHOICES_SHOWN names with how many more there are."""
    shown = ", ".join(names[:MAX_CHOICES_SHOWN])
    more = len(names) - MAX_CHOICES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def clock(seconds: float) -> str:
    """A duration as sacct prints Elapsed and Timelimit: HH:MM:SS, D-HH:MM:SS from a day."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def ago(value: str, *, now: datetime | None = None) -> str:
    """How long before `now` an API timestamp was, in ago_words."""
    return ago_words(((now or datetime.now(UTC)) - instant(value)).total_seconds())


def ago_words(age_s: float) -> str:
    """How long ago, in whole units as clocks are read: "just now", "3 min ago", "1 h 05 min ago",
    "2 d 4 h ago" (the web pages say it so too: scheduler_app/templatetags/as_of.py)."""
    whole = max(0, int(age_s))
    minutes, hours, days = whole // 60, whole // 3600, whole // 86400
    if minutes < 1:
        return "just now"
    if hours < 1:
        return f"{minutes} min ago"
    if days < 1:
        return f"{hours} h {minutes % 60:02d} min ago"
    return f"{days} d {hours % 24} h ago"


def as_of(value: str | None, *, now: datetime | None = None) -> str:
    """As of when an estimate holds: "2026-11-30 12:04 (3 min ago)"; "-" when the service gave none."""
    if not value:
        return "-"
    return f"{when(value)} ({ago(value, now=now)})"


def estimates_as_of_line(jobs: Iterable[dict[str, Any]], *, now: datetime | None = None) -> str:
    """queue's last line: as of when the oldest estimate shown holds ("" when none shows one: no
    estimate, or a service that does not say)."""
    times = [job["estimate_as_of"] for job in jobs if job.get("estimate_as_of")]
    if not times:
        return ""
    oldest = min(times, key=instant)
    return f"Estimates as of {as_of(oldest, now=now)} or newer\n"
