"""The restart-cost axis of bench.reproduce_synergy and bench.reproduce_genie (docs/reproduction.md).

At cost 0 a run is the papers' setting: restarts are free and rounds re-decide every job
(simulate(restarts=None, restart_costs=None)). At a cost c > 0 every start waits c seconds, a restart
loses the work since the job's last checkpoint (every CHECKPOINT_EVERY_S of run) and the rounds weigh
restarts with the move guard (a RestartPolicy: the live service's defaults unless the options say
otherwise). Both arms of a comparison (the baseline and the paper's scheduler) run with the same costs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator import SimulationResult
from scheduler_app.simulator.restart_costs import RestartCosts

DEFAULT_COSTS_S = (0.0, 30.0, 120.0, 300.0)
CHECKPOINT_EVERY_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--restart-costs and the move guard's parameters (defaults: RestartPolicy's, the live ones)."""
    defaults = RestartPolicy()
    parser.add_argument(
        "--restart-costs",
        help="seconds of start-up per restart, a comma list (e.g. 0,30,120,300); with a checkpoint every "
        f"{CHECKPOINT_EVERY_S:g} s and the move guard on at a nonzero cost",
    )
    parser.add_argument("--min-run-s", type=float, default=defaults.min_run_s, help="the guard's minimum run")
    parser.add_argument(
        "--move-horizon-s", type=float, default=defaults.horizon_s, help="the guard's horizon"
    )
    parser.add_argument("--move-margin", type=float, default=defaults.margin, help="the guard's margin")
    parser.add_argument(
        "--free-first-start",
        action="store_true",
        help="charge restarts only: a job's first start waits nothing (every scheduler pays it once); "
        "by default every start waits the cost's start-up, the first too",
    )


def costs_of(text: str | None) -> tuple[float, ...]:
    if not text:
        return DEFAULT_COSTS_S
    costs = tuple(float(x) for x in text.split(","))
    if any(c < 0 for c in costs):
        raise ValueError(f"restart costs must be >= 0 s, got {text}")
    return costs


def policy_of(args: argparse.Namespace) -> RestartPolicy:
    return RestartPolicy(min_run_s=args.min_run_s, horizon_s=args.move_horizon_s, margin=args.move_margin)


def policy_note(policy: RestartPolicy) -> str:
    return (
        f"move guard: minimum run {policy.min_run_s:g} s, horizon {policy.horizon_s:g} s, margin "
        f"{policy.margin:g}, resizes in place {'on' if policy.resize_in_place else 'off'}, one server "
        f"{'on' if policy.one_server else 'off'}"
    )


def command_options(args: argparse.Namespace) -> str:
    """The restart options as they were given, for the printed command."""
    out = f" --restart-costs {args.restart_costs}" if args.restart_costs else ""
    defaults = RestartPolicy()
    for flag, value, default in (
        ("--min-run-s", args.min_run_s, defaults.min_run_s),
        ("--move-horizon-s", args.move_horizon_s, defaults.horizon_s),
        ("--move-margin", args.move_margin, defaults.margin),
    ):
        if value != default:
            out += f" {flag} {value:g}"
    if getattr(args, "free_first_start", False):
        out += " --free-first-start"
    return out


def startup_note(args: argparse.Namespace) -> str:
    """How the start-up is charged, for the printed section."""
    if getattr(args, "free_first_start", False):
        return "restarts only wait it: a job's first start waits nothing"
    return "every start waits it, the first too"


def simulate_kwargs(
    cost_s: float, policy: RestartPolicy, *, first_start_waits: bool = True
) -> dict[str, Any]:
    """simulate()'s restart arguments at `cost_s` seconds per restart (0: the papers' free restarts);
    `first_start_waits=False` charges restarts only (--free-first-start)."""
    if cost_s == 0:
        return {"restarts": None, "restart_costs": None}
    costs = RestartCosts(
        startup_s=cost_s, checkpoint_every_s=CHECKPOINT_EVERY_S, first_start_waits=first_start_waits
    )
    return {"restarts": policy, "restart_costs": costs}


def restart_figures(result: SimulationResult, job_ids: Sequence[int] | None = None) -> dict[str, float]:
    """Preemptions and moves per started job, and GPU-hours lost to restarts, over `job_ids` (all)."""
    wanted = None if job_ids is None else set(job_ids)
    records = [r for r in result.records if r.start_s is not None and (wanted is None or r.job_id in wanted)]
    n = max(1, len(records))
    return {
        "preemptions_per_job": sum(r.preemptions for r in records) / n,
        "moves_per_job": sum(r.moves for r in records) / n,
        "lost_gpu_h": sum(r.restart_lost_gpu_s for r in records) / 3600.0,
    }


def kept_pct(gain0: float, gain: float) -> float:
    """The share of the zero-cost gain kept, in percent (gains as improvements: 0 = none)."""
    return 100.0 * gain / gain0 if gain0 > 0 else float("nan")


def cost_label(cost_s: float) -> str:
    return "0 (free, no guard)" if cost_s == 0 else f"{cost_s:g} s"


def cost_key(row: Sequence[Any] | str) -> float:
    """A table row's restart cost, from its first cell (cost_label's text), to print rows by cost."""
    first = row.strip("| ").split(" |")[0] if isinstance(row, str) else str(row[0])
    return float(first.split()[0])


def by_cost(rows: Sequence[str]) -> list[str]:
    """Markdown rows in order of their restart cost (stable: a cost's rows keep their order)."""
    return sorted(rows, key=cost_key)
