"""The stages a placement walks through while jobs claim their GPUs of last round, in order.

A stage says which capacity of the round a score may choose from: GPUs nobody claims or every free
GPU, and cores/memory nobody reserved or everything free; the two home stages offer the owner its
own GPUs instead (strict: beside its neighbours' reservations; lenient: whatever is free there).
`STAGES` is the order every search follows (`RoundState.walk`): the owner's home, then room nobody
held, then the home again leniently, then unclaimed GPUs taking reserved room (last round's demand,
which may shrink), then anywhere (a GPU taken there is a claimant moved). Without claims only
`ANYWHERE` runs, and since it is the plain rule, claims never decide whether a demand fits, only
where it goes. A new stage (say, a reservation's servers before the rest) is one more entry here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# What a stage draws from (Stage.gpus, Stage.room).
ALL_FREE = "free"
UNCLAIMED_ONLY = "unclaimed"
UNRESERVED_ONLY = "unreserved"
# How a home stage judges the owner's own servers (Stage.home).
STRICT = "strict"
LENIENT = "lenient"


@dataclass(frozen=True, slots=True)
class Stage:
    """One step of the search: a view of the round's capacity, or the owner's home."""

    name: str
    gpus: str = ALL_FREE  # ALL_FREE or UNCLAIMED_ONLY: the GPUs a score may take
    room: str = ALL_FREE  # ALL_FREE or UNRESERVED_ONLY: the cores/memory that count
    home: str | None = None  # STRICT or LENIENT: offer the owner's own GPUs (no score runs)
    # True for a stage that differs from ANYWHERE only while claims stand (skipped otherwise);
    # a field, not a property, since every search reads it.
    needs_claims: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs_claims", self.gpus != ALL_FREE or self.room != ALL_FREE)


HOME = Stage("home", home=STRICT)
UNRESERVED = Stage("unreserved", gpus=UNCLAIMED_ONLY, room=UNRESERVED_ONLY)
HOME_LENIENT = Stage("home_lenient", home=LENIENT)
UNCLAIMED = Stage("unclaimed", gpus=UNCLAIMED_ONLY)
ANYWHERE = Stage("anywhere")

STAGES: tuple[Stage, ...] = (HOME, UNRESERVED, HOME_LENIENT, UNCLAIMED, ANYWHERE)
# The stages that remain once no claim stands (the others would only repeat ANYWHERE).
STAGES_WITHOUT_CLAIMS: tuple[Stage, ...] = tuple(s for s in STAGES if not s.needs_claims)


class View(NamedTuple):
    """The capacity one stage offers, per server position (lists owned by RoundState: read only).

    `counts[i]`: usable GPUs on server i; `buckets[b]`: the servers with b usable GPUs, lowest
    position first; `cpus[i]` / `mem_gb[i]`: usable cores and GB; `prefer[i]` (ANYWHERE while
    claims stand, else None): unclaimed GPUs, so a score may take the fewest claimed ones.
    """

    buckets: list[list[int]]
    counts: list[int]
    cpus: list[float]
    mem_gb: list[float]
    prefer: list[int] | None
