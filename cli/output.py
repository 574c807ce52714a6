"""How the command line prints: local times, aligned tables, lists of choices."""

from __future__ import annotations

from datetime import datetime
from typing import TextIO

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
