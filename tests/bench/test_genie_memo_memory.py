"""bench.genie_memo_memory fills genie's memo to its bound, measures it, and leaves the memo empty."""

from __future__ import annotations

import re

from bench import genie_memo_memory
from scheduler_app.core.allocators import genie_points


def test_the_memo_is_measured_full_and_left_empty(capsys):
    genie_memo_memory.main([])
    out = capsys.readouterr().out
    assert f"memo at its bound ({genie_points.MEMO_SIZE} entries" in out
    held = [float(x) for x in re.findall(r"([0-9.]+) MiB", out)]
    entries_mib, profiles_mib, total_mib, simulation_mib = held
    assert entries_mib > 0 and profiles_mib > 0
    assert abs(total_mib - entries_mib - profiles_mib) <= 0.1 + 1e-9  # each part rounded to 0.05
    assert simulation_mib < entries_mib  # 48 entries against thousands
    assert genie_points.memo_entries() == 0
