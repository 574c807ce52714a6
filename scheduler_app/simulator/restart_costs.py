"""What a restart costs in a simulation: each job's start-up and checkpoint interval (docs/restarts.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RestartCosts:
    """The simulator's restart cost model; `simulate(restart_costs=None)` charges nothing (the papers).

    - `startup_s`: seconds from a job's launch to its first progress (process, CUDA and NCCL set-up,
      data loaders), waited at every start: the first one and every restart.
    - `startup_s_by_model`: a start-up per workload (trace model name), in place of `startup_s`.
    - `checkpoint_every_s`: a job saves its progress after every this many seconds of run (its
      start-up not counted); a restart loses the run since the last save and the job does it again.
      None: no checkpoints, a restart loses its lease's whole run.
    - `first_start_waits`: whether a job's first start waits its start-up too (the live model and the
      forecast: it does); False charges restarts only, as every scheduler pays a first start once.
    """

    startup_s: float = 0.0
    checkpoint_every_s: float | None = None
    startup_s_by_model: Mapping[str, float] = field(default_factory=dict)
    first_start_waits: bool = True

    def __post_init__(self) -> None:
        for name, value in (("startup_s", self.startup_s), *self.startup_s_by_model.items()):
            if not value >= 0:
                raise ValueError(f"start-up of {name} must be >= 0 s, got {value}")
        if self.checkpoint_every_s is not None and not self.checkpoint_every_s > 0:
            raise ValueError(f"checkpoint_every_s must be > 0 or None, got {self.checkpoint_every_s}")

    def startup_of(self, model: str) -> float:
        return float(self.startup_s_by_model.get(model, self.startup_s))

    def to_dict(self) -> dict[str, Any]:
        return {
            "startup_s": self.startup_s,
            "checkpoint_every_s": self.checkpoint_every_s,
            "startup_s_by_model": dict(self.startup_s_by_model),
            "first_start_waits": self.first_start_waits,
        }
