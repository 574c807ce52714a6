"""Applying a reused round's plan again from a per-plan template: the same additions, worked out once."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scheduler_app.core.types import Outcome, Placement, RoundPlan

# A job finishes inside a round within this relative slack (`finishes_within`); sim_run imports it.
FINISH_REL_TOL = 1e-9


def finishes_within(remaining_iters: float, rate: float, run_s: float) -> bool:
    """Whether a job with `remaining_iters` left at `rate` iterations a second finishes within `run_s`.
    The hot paths (SimRun.apply, `run` below) inline it, in the same float operations."""
    return remaining_iters / rate <= run_s * (1.0 + FINISH_REL_TOL)


class Template:
    """What applying `plan` again adds, per placed job in the plan's order and per round, when the plan
    is applied again to the state it left (simulate()'s steady plan): every placed job continues its
    lease on the very Placement it holds, with no start-up left and no checkpoints, and every waiting
    job stays waiting, so `SimRun.apply` would take its inlined continue path for each job, with the
    same round length. The per-job products (GPUs x round, cores x round ...) and the round's sums are
    the ones apply computes, and `run` adds them in the same order: every float is the same.
    """

    __slots__ = ("placed", "plan", "round_end", "round_s", "rows", "sums")

    def __init__(self, plan: RoundPlan, rows: list[tuple], sums: tuple, round_s: float, round_end: bool):
        self.plan = plan
        self.rows = rows
        self.sums = sums
        self.placed = len(rows)
        self.round_s = round_s
        self.round_end = round_end


def build(plan: RoundPlan, active: Mapping, round_s: float, round_end: bool) -> Template | None:
    """The template of `plan` for the jobs `active` now, or None when apply would take another path
    for some job (a new or moved lease, a start-up, checkpoints, a pause, a drop, a finished job)."""
    if not round_s > 0 or len(plan.decisions) != len(active):
        return None
    rows: list[tuple] = []
    sums = [0.0, 0.0, 0.0, 0.0, 0.0]
    for decision in plan.decisions:
        job = active.get(decision.job_id)
        if job is None:
            return None
        placement = decision.placement
        if placement is None:
            if job.current is not None or decision.outcome is Outcome.INFEASIBLE:
                return None
            continue
        resources = job.resources
        if (
            placement is not job.current
            or job.startup_left_s
            or job.checkpoint_every_s
            or job.start_s is None
            or job.finish_s is not None
            or resources is None
        ):
            return None
        rows.append(_row(job, placement, resources, round_s, round_end))
        gpus, cpus, mem_gb, cpus_used, mem_used = resources
        sums[0] += gpus
        sums[1] += cpus
        sums[2] += mem_gb
        sums[3] += cpus_used
        sums[4] += mem_used
    return Template(plan, rows, tuple(sums), round_s, round_end)


def _row(job: Any, placement: Placement, resources: tuple, round_s: float, round_end: bool) -> tuple:
    """A placed job's row: what applying its continuing lease for a round adds (see Template)."""
    gpus, cpus, mem_gb, cpus_used, mem_used = resources
    if round_end:
        step = math.floor(round_s / (job.iter_time_s / placement.speedup))
        rate = 0.0
    else:
        rate = placement.speedup / job.iter_time_s
        step = round_s * rate
    return (
        job,
        step,
        rate,
        round_s * gpus,
        gpus * round_s,
        cpus * round_s,
        mem_gb * round_s,
        cpus_used * round_s,
        mem_used * round_s,
        job.owner_id,
    )


def without(template: Template, done: list) -> Template:
    """`template` less the rows of the jobs `done` (they finished as it was applied), its sums worked
    out again over the rows left in order, as `build` adds them: for the next plan, `adopt`ed to it.
    Its `plan` is still the old one until then."""
    gone = {id(job) for job in done}
    rows = [row for row in template.rows if id(row[0]) not in gone]
    s_gpu = s_cpu = s_mem = s_cpu_used = s_mem_used = 0.0
    for row in rows:
        gpus, cpus, mem_gb, cpus_used, mem_used = row[0].resources
        s_gpu += gpus
        s_cpu += cpus
        s_mem += mem_gb
        s_cpu_used += cpus_used
        s_mem_used += mem_used
    sums = (s_gpu, s_cpu, s_mem, s_cpu_used, s_mem_used)
    return Template(template.plan, rows, sums, template.round_s, template.round_end)


def adopt(template: Template, plan: RoundPlan, active: Mapping) -> Template | None:
    """`template`'s rows as the template of `plan`, when `build(plan, active)` would give these rows
    and sums: `plan` places exactly the rows' jobs, in the rows' order, each on the very Placement
    it holds (so each still continues its lease, with no start-up and no checkpoints, as when its row
    was built), and leaves every other active job waiting (the simulator's next plan: the last one
    less the jobs just finished, or with arrivals waiting behind it). None otherwise."""
    decisions = plan.decisions
    if len(decisions) != len(active):
        return None
    rows = template.rows
    n = len(rows)
    r = 0
    for decision in decisions:
        placement = decision.placement
        if placement is None:
            if decision.outcome is Outcome.INFEASIBLE:
                return None
            job = active.get(decision.job_id)
            if job is None or job.current is not None:
                return None
            continue
        if r == n:
            return None
        job = rows[r][0]
        if job.job_id != decision.job_id or placement is not job.current or job.finish_s is not None:
            return None
        r += 1
    if r != n:
        return None
    return Template(plan, rows, template.sums, template.round_s, template.round_end)


def adopt_prefix(template: Template, plan: RoundPlan, active: Mapping) -> int | None:
    """How many of `plan`'s first decisions `template`'s rows apply (SimRun.apply's continue path for
    each, so `run` gives what applying them one by one would), when `plan` places the rows' jobs
    first, in the rows' order, each on the very Placement it holds, with only waiting jobs among them:
    a steady plan with arrivals placed behind it (Allocator.extend). The decisions after them are
    applied one by one. None when `plan` does not start so, or places nothing after the rows."""
    decisions = plan.decisions
    rows = template.rows
    n = len(rows)
    if not n or len(decisions) != len(active):
        return None
    r = 0
    for at, decision in enumerate(decisions):
        if r == n:
            return at if any(d.placement is not None for d in decisions[at:]) else None
        placement = decision.placement
        if placement is None:
            if decision.outcome is Outcome.INFEASIBLE:
                return None
            job = active.get(decision.job_id)
            if job is None or job.current is not None:
                return None
            continue
        job = rows[r][0]
        if job.job_id != decision.job_id or placement is not job.current or job.finish_s is not None:
            return None
        r += 1
    return None


def with_started(template: Template, plan: RoundPlan, started: list, active: Mapping) -> Template | None:
    """The template of `plan`, just applied as `template`'s rows then `started` (the jobs it placed
    after them, in plan order) one by one: their rows added after the others', as `build` would make
    them for `plan`'s next application; None when `build` would give None (a job with a start-up
    left or checkpoints, one finished, a job of `plan` waiting that ran)."""
    if len(plan.decisions) != len(active):
        return None
    rows = list(template.rows)
    sums = list(template.sums)
    round_s, round_end = template.round_s, template.round_end
    for job in started:
        placement = job.current
        resources = job.resources
        if (
            placement is None
            or job.startup_left_s
            or job.checkpoint_every_s
            or job.start_s is None
            or job.finish_s is not None
            or resources is None
        ):
            return None
        rows.append(_row(job, placement, resources, round_s, round_end))
        gpus, cpus, mem_gb, cpus_used, mem_used = resources
        sums[0] += gpus
        sums[1] += cpus
        sums[2] += mem_gb
        sums[3] += cpus_used
        sums[4] += mem_used
    return Template(plan, rows, tuple(sums), round_s, round_end)


def run(template: Template, now_s: float, totals: list[float], owner_gained: dict, blind: bool) -> list:
    """Apply `template`'s plan once more at `now_s` (SimRun.apply's continue path for every placed job,
    the same operations in the same order); returns the jobs that finished."""
    round_s = template.round_s
    done_now = []
    if template.round_end:
        # The five totals in locals: each is still added to row by row, in the rows' order.
        t_gpu, t_cpu, t_mem, t_cpu_used, t_mem_used = totals
        for job, step, _rate, held_gpu_s, g, c, m, cu, mu, owner in template.rows:
            done = job.done_iters + step
            job.since_ckpt_s += round_s
            if done >= job.total_iters:
                job.done_iters = job.total_iters
                job.finish_s = now_s + round_s
                done_now.append(job)
            else:
                job.done_iters = done
            if not blind:
                job.view = None
            job.attained_gpu_s += held_gpu_s
            if owner is not None:
                owner_gained[owner] += held_gpu_s
            t_gpu += g
            t_cpu += c
            t_mem += m
            t_cpu_used += cu
            t_mem_used += mu
        totals[:] = t_gpu, t_cpu, t_mem, t_cpu_used, t_mem_used
        return done_now
    limit_s = round_s * (1.0 + FINISH_REL_TOL)  # finishes_within, inlined
    for job, step, rate, held_gpu_s, g, c, m, cu, mu, owner in template.rows:
        need_s = (job.total_iters - job.done_iters) / rate
        if not blind:
            job.view = None
        if need_s <= limit_s:
            job.done_iters = job.total_iters
            job.finish_s = now_s + 0.0 + need_s
            held_s = 0.0 + need_s
            done_now.append(job)
            gpus, cpus, mem_gb, cpus_used, mem_used = job.resources
            job.attained_gpu_s += held_s * gpus
            if owner is not None:
                owner_gained[owner] += held_s * gpus
            totals[0] += gpus * held_s
            totals[1] += cpus * held_s
            totals[2] += mem_gb * held_s
            totals[3] += cpus_used * held_s
            totals[4] += mem_used * held_s
            continue
        job.done_iters += step
        job.since_ckpt_s += round_s
        job.attained_gpu_s += held_gpu_s
        if owner is not None:
            owner_gained[owner] += held_gpu_s
        totals[0] += g
        totals[1] += c
        totals[2] += m
        totals[3] += cu
        totals[4] += mu
    return done_now
