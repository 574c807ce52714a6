"""GENIE's interference term (1 + kappa x): timed in every plan, avoided by the genie allocator."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie import GenieAllocator
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.interference import colocated_comm_jobs, interference_factor, with_interference
from scheduler_app.core.predictor import fit_interference_kappa
from scheduler_app.core.types import JobView, Placement, RoundPlan, SensitivityProfile, ServerShare
from tests.builders import make_cluster
from tests.scheduler_app.core.helpers import FLAT

NOISY = dataclasses.replace(FLAT, interference_kappa=0.5)


def job(job_id: int, gpus: int, profile: SensitivityProfile = NOISY, deadline_s: float | None = None):
    """1,000 s of work at speed 1."""
    return JobView(job_id, gpus, 0.0, profile, total_iters=1000.0, deadline_s=deadline_s)


def placement(job_id: int, *servers: tuple[int, int]) -> Placement:
    shares = tuple(ServerShare(s, tuple(range(k)), 3 * k, 62.5 * k) for s, k in servers)
    return Placement(job_id, shares, 1.0)


def test_colocated_counts_only_communicating_neighbours():
    plan = [placement(1, (0, 2)), placement(2, (0, 2)), placement(3, (0, 1)), placement(4, (1, 2), (0, 2))]
    # Job 4 spans servers 0 and 1; job 3 has one GPU, so it is nobody's communicating neighbour.
    assert colocated_comm_jobs(plan) == {1: 2, 2: 2, 3: 3, 4: 2}
    assert interference_factor(NOISY, 2, 2) == 2.0
    assert interference_factor(NOISY, 1, 3) == 1.0  # a 1-GPU job does not all-reduce
    assert interference_factor(FLAT, 2, 2) == 1.0  # kappa 0 until measured


def test_every_plan_is_timed_with_interference_whatever_the_allocator():
    jobs = [job(1, 2), job(2, 2), job(3, 1)]
    plan = schedule_round(make_cluster(1), jobs, policy="fifo", allocator="proportional", now_s=0.0)
    assert [d.placement.speedup for d in plan.decisions] == pytest.approx([1 / 1.5, 1 / 1.5, 1.0])
    quiet = [dataclasses.replace(j, profile=FLAT) for j in jobs]
    plan = schedule_round(make_cluster(1), quiet, policy="fifo", allocator="proportional", now_s=0.0)
    assert with_interference(plan, quiet) is plan  # nothing measured: the plan as it was
    assert [d.placement.speedup for d in plan.decisions] == [1.0, 1.0, 1.0]
    assert with_interference(RoundPlan(()), jobs) == RoundPlan(())


def servers_of(plan: RoundPlan, job_id: int) -> list[int]:
    return [s.server_id for s in plan.decision_for(job_id).placement.shares]


@pytest.mark.parametrize(("profile", "server"), [(FLAT, 0), (NOISY, 1)])
def test_a_deadline_job_is_kept_from_a_communicating_neighbour_its_deadline_cannot_afford(profile, server):
    # Job 1 (4 GPUs) goes first onto server 0. Job 2 (4 GPUs) needs speed 0.8: best fit is the rest
    # of server 0, where 1 / (1 + 0.5) = 0.67 would be too slow once kappa is measured.
    jobs = [job(1, 4, profile), job(2, 4, profile, deadline_s=1250.0)]
    plan = GenieAllocator(slack=1.0, work_conserving=False).allocate_at(jobs, make_cluster(2), 0.0)
    assert servers_of(plan, 1) == [0] and servers_of(plan, 2) == [server]
    assert plan.decision_for(2).reason == reasons.QOS_FIT


@pytest.mark.parametrize(("profile", "server"), [(FLAT, 0), (NOISY, 1)])
def test_a_communicating_job_is_kept_away_from_a_deadline_job_it_would_make_late(profile, server):
    jobs = [job(1, 4, profile, deadline_s=1250.0), job(2, 4, profile)]
    plan = GenieAllocator(slack=1.0, work_conserving=False).allocate_at(jobs, make_cluster(2), 0.0)
    assert servers_of(plan, 1) == [0] and servers_of(plan, 2) == [server]


def test_with_nowhere_else_to_go_the_deadline_job_waits_with_its_reason():
    jobs = [job(1, 4, deadline_s=1250.0), job(2, 4, deadline_s=1250.0)]
    plan = GenieAllocator(slack=1.0, work_conserving=False).allocate_at(jobs, make_cluster(1), 0.0)
    assert plan.decision_for(1).outcome.value == "placed"
    assert (plan.decision_for(2).outcome.value, plan.decision_for(2).reason) == (
        "pending",
        reasons.QOS_INTERFERENCE,
    )
    # A best-effort job of one GPU does not communicate: it may share the server.
    genie = GenieAllocator(slack=1.0, work_conserving=False)
    plan = genie.allocate_at([jobs[0], job(3, 1)], make_cluster(1), 0.0)
    assert plan.decision_for(3).outcome.value == "placed"


def test_kappa_is_fitted_from_leases_alone_and_co_located():
    # Alone the workload runs at 1.0 x its prediction (median); next to x others at 1 / (1 + 0.3 x).
    alone = [1.0, 0.98, 1.05]
    together = [(1 / 1.3, 1), (1 / 1.6, 2), (1 / 1.3, 1), (0.2, 1)]  # the last one an outlier
    assert fit_interference_kappa(alone, together) == pytest.approx(0.3)
    assert fit_interference_kappa(alone, together[:2]) is None  # too few co-located leases
    assert fit_interference_kappa(alone, [(1.2, 1)] * 3) == 0.0  # faster together: no interference
    assert fit_interference_kappa(alone, [(0.01, 1)] * 3) == 2.0  # clamped: a fault, not interference
