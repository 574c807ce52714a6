"""Where the tests find the reference traces copied into the project (tests/data/synergy/README.md)."""

from pathlib import Path

SYNERGY_TRACES = Path(__file__).resolve().parent / "data" / "synergy"
