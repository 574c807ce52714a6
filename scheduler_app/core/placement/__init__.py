"""Placement: the round's shared free capacity, the stages of a search, and filter and score pieces.

Modelled on the Kubernetes scheduler framework's filter and score plugins (docs/placement.md):
- state.py `RoundState`: free GPUs, cores and memory per server for one round; `find` / `take` /
  `adjust`, stickiness (claims.py) and node counts (nodes.py).
- stages.py: the ordered stages a search walks while jobs claim last round's GPUs (home,
  unreserved, home leniently, unclaimed, anywhere), as `Stage` objects and their `View`s.
- filters.py: which servers may take a job (`ServerFilter`; the resource fit `gpus_fitting`).
- scores.py: in which order servers are taken (`Score`: `PACKED`, `FIRST_FIT`; `fill`).
- feasibility.py: what no placement changes (infeasible jobs, GPU-only admission, pending reasons).
- plan.py: held shares, the plan being built, a per-call demand memo.
- setup.py: the set-up every allocator's round shares.
"""

from scheduler_app.core.placement.feasibility import (
    gpu_admission,
    has_fixed_demand,
    infeasible_reason,
    infeasible_reasons,
    pending_reason,
)
from scheduler_app.core.placement.filters import MinServerGpus, OnServers, ServerFilter, gpus_fitting
from scheduler_app.core.placement.plan import EPS, DemandCache, HeldJob, HeldShare, Plan, PlanBuilder
from scheduler_app.core.placement.scores import FIRST_FIT, PACKED, SCORES, OrderedScore, Score, score_named
from scheduler_app.core.placement.stages import (
    ANYWHERE,
    HOME,
    HOME_LENIENT,
    STAGES,
    UNCLAIMED,
    UNRESERVED,
    Stage,
)
from scheduler_app.core.placement.state import RoundState

__all__ = [
    "ANYWHERE",
    "EPS",
    "FIRST_FIT",
    "HOME",
    "HOME_LENIENT",
    "PACKED",
    "SCORES",
    "STAGES",
    "UNCLAIMED",
    "UNRESERVED",
    "DemandCache",
    "HeldJob",
    "HeldShare",
    "MinServerGpus",
    "OnServers",
    "OrderedScore",
    "Plan",
    "PlanBuilder",
    "RoundState",
    "Score",
    "ServerFilter",
    "Stage",
    "gpu_admission",
    "gpus_fitting",
    "has_fixed_demand",
    "infeasible_reason",
    "infeasible_reasons",
    "pending_reason",
    "score_named",
]
