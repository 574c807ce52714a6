"""PlanValuer: several plans of one round valued at once give plan_value's floats, call for call."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from scheduler_app.core.restarts import (
    PlanValuer,
    RestartPolicy,
    _deadline_bonus_s,
    change_of,
    finish_offset_s,
    is_restart,
    lost_work_s,
    plan_value,
)
from scheduler_app.core.types import ClusterSnapshot, JobView, Placement, ServerShare
from scheduler_app.core.waiting_starts import waiting_start_offsets
from tests.builders import make_cluster, make_job

NOW_S = 10_000.0


def _round(seed: int):
    """A random round: jobs running on 4 servers of 4 GPUs (some with deadlines, checkpoints and
    start-ups), others waiting, and plans that keep, move, preempt or start some of them, sharing
    most placements as objects (as a guard's plans do)."""
    rng = random.Random(seed)
    cluster = make_cluster(4, gpus=4, cpus=12, mem_gb=250.0)
    jobs, current = [], {}
    free = [(s, g) for s in range(4) for g in range(4)]
    rng.shuffle(free)
    for job_id in range(1, 25):
        job = make_job(
            job_id,
            rng.choice(["res18", "alexnet", "lstm", "m5"]),
            total_iters=float(rng.randint(100, 20_000)),
            done_iters=float(rng.randint(0, 90)),
            deadline_s=NOW_S + rng.randint(100, 6000) if rng.random() < 0.3 else None,
        )
        extra = {"startup_s": rng.choice([0.0, 30.0]), "checkpoint_every_s": rng.choice([None, 600.0])}
        if free and rng.random() < 0.6:
            server, gpu = free.pop()
            where = Placement(job_id, (ServerShare(server, (gpu,), 3, 60.0),), rng.uniform(0.5, 1.5))
            current[job_id] = where
            extra.update(current=where, lease_started_s=NOW_S - rng.uniform(0.0, 2000.0))
        jobs.append(replace(job, **extra))
    plans = []
    for _ in range(4):
        plan = {}
        for job in jobs:
            roll = rng.random()
            if job.job_id in current and roll < 0.7:
                plan[job.job_id] = current[job.job_id]  # the same object
            elif roll < 0.85:
                server = rng.randrange(4)
                plan[job.job_id] = Placement(
                    job.job_id, (ServerShare(server, (rng.randrange(4),), 3, 60.0),), rng.uniform(0.5, 2.0)
                )
        plans.append(plan)
    order = jobs[:]
    rng.shuffle(order)
    return cluster, order, plans


def _plan_value_as_first_written(
    placements: Mapping[int, Placement],
    ordered: Sequence[JobView],
    now_s: float,
    policy: RestartPolicy,
    *,
    charge_restarts: bool = True,
    snapshot: ClusterSnapshot | None = None,
) -> float:
    """restarts.plan_value as it was before PlanValuer (one plan a call): the reference."""
    horizon_s = policy.horizon_s
    value = 0.0
    n = len(ordered)
    finishes: dict[int, tuple[float, tuple[tuple[int, int], ...]]] = {}
    waiting: list[tuple[JobView, float]] = []
    for rank, job in enumerate(ordered):
        remaining = job.remaining_iters
        if remaining <= 0 or job.profile.iter_time_s <= 0:
            continue
        weight = 1.0 + (n - rank) / n
        # Its present speed (a job not running: its proportional one), the speed after the horizon.
        now_rate = (job.current.speedup if job.current is not None else 1.0) / job.profile.iter_time_s
        placement = placements.get(job.job_id)
        change = change_of(job.current, placement)
        restarted = charge_restarts and is_restart(change, policy, job.current)
        redo_iters = lost_work_s(job, now_s) * now_rate if restarted and job.current is not None else 0.0
        rate = placement.speedup / job.profile.iter_time_s if placement is not None else 0.0
        if placement is None or rate <= 0:
            if placement is None and job.current is None:
                waiting.append((job, weight))
                continue
            owed_s = job.startup_s if restarted else 0.0
            finish_s = horizon_s + owed_s + (remaining + redo_iters) / now_rate
            value -= weight * (finish_s - _deadline_bonus_s(job, now_s + finish_s, horizon_s))
            continue
        started = job.current is None or restarted
        delay_s = job.startup_s if started else 0.0
        finish_s = finish_offset_s(delay_s, remaining + redo_iters, rate, now_rate, horizon_s)
        value -= weight * (finish_s - _deadline_bonus_s(job, now_s + finish_s, horizon_s))
        if snapshot is not None:
            shares = tuple((share.server_id, len(share.gpu_indices)) for share in placement.shares)
            finishes[job.job_id] = (finish_s, shares)
    starts = (
        waiting_start_offsets(finishes, [job for job, _ in waiting], snapshot, horizon_s)
        if snapshot is not None and waiting
        else {}
    )
    for job, weight in waiting:
        rate = 1.0 / job.profile.iter_time_s
        at_s = starts.get(job.job_id, horizon_s)  # not within the horizon: after it
        finish_s = finish_offset_s(at_s + job.startup_s, job.remaining_iters, rate, rate, horizon_s)
        value -= weight * (finish_s - _deadline_bonus_s(job, now_s + finish_s, horizon_s))
    return value


def test_a_valuer_gives_plan_values_floats_for_every_plan_and_charge():
    policy = RestartPolicy(horizon_s=1800.0)
    for seed in range(60):
        cluster, ordered, plans = _round(seed)
        for snapshot in (cluster, None):
            valuer = PlanValuer(ordered, NOW_S, policy, snapshot)
            for plan in plans:
                for charge in (True, False):
                    expected = _plan_value_as_first_written(
                        plan, ordered, NOW_S, policy, charge_restarts=charge, snapshot=snapshot
                    )
                    assert valuer.value(plan, charge_restarts=charge) == expected
                    assert (
                        plan_value(plan, ordered, NOW_S, policy, charge_restarts=charge, snapshot=snapshot)
                        == expected
                    )
                moving, charged = valuer.pair(plan)
                assert moving == plan_value(
                    plan, ordered, NOW_S, policy, charge_restarts=False, snapshot=snapshot
                )
                assert charged == plan_value(plan, ordered, NOW_S, policy, snapshot=snapshot)
