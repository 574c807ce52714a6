"""The Synergy reproduction's output: Markdown tables, spreads over seeds, headings, progress lines."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from typing import Any


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


# -- formatting -----------------------------------------------------------------------------------------
def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if v != v else f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def spread(values: Sequence[float]) -> str:
    """'mean (min-max)' over seeds, or the value alone for one seed."""
    vals = [v for v in values if v == v]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.2f}"
    return f"{statistics.fmean(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"


def section(title: str, command: str) -> None:
    print(f"\n### {title}\n\nCommand: `{command}`\n")
