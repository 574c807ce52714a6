"""SWAF's tail behind the forecast's window: whether a new job without a QoS target has `count` pending
jobs certainly ahead of it, in one statement.

Under SWAF (core/policies/swaf.py) a job without a QoS target comes after every job of a higher
priority, every job of its priority with a target or aged, and every job without a target whose
remaining proportional execution time E_prop is smaller (SwafPolicy.submitted_tail_ahead). E_prop is
remaining iterations x the seconds per iteration that the rounds give a job of that workload on that
many GPUs (selectors/rounds.py: its profile, or its proportional one without a sensitivity matrix,
then throughput.job_profile): one rate per (workload, GPU count), kept per process in a small table.
The statement compares each pending job's remaining iterations with the threshold of its group,
E_prop(new) / rate, and stops at the count-th job ahead, whatever the queue's length. The table is
exact: the statement also reads a digest of the catalog's row versions, and a table built from other
rows (a profile measured, a speed correction learnt since) is built again and the count read again. It
may only undercount: GPU counts that no pending job had when the table was built, own commands (no
rate) and the aged jobs of a longer E_prop are not counted, and the worker answers those it leaves
inside the window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from django.db import connection

from profiles_app.models import Workload
from profiles_app.selectors import workload_profile
from scheduler_app.core.policies.swaf import SwafPolicy, TailAhead
from scheduler_app.core.throughput import REFERENCE_SHAPE, job_profile
from scheduler_app.core.types import JobView, SensitivityProfile
from scheduler_app.models import TERMINAL_JOB_STATES, Job, JobState
from scheduler_app.selectors.rounds import proportional_profile

# A threshold a hair below E_prop(new) / rate: a job whose E_prop rounds to the new job's is not
# counted (the comparison in iterations is not the core's product to the last bit).
REL_MARGIN = 1e-9
# How long the GPU counts of the pending jobs are reused before they are read again (the rates stay
# exact whatever this is: a GPU count missing from the table only undercounts).
GPU_COUNTS_REUSE_S = 30.0
BIGINT_MAX = 2**63 - 1


@dataclass(frozen=True)
class Rates:
    """Seconds per iteration at the GPU-proportional point of each (workload id, GPU count), and the
    digest of the catalog's rows they were worked out from."""

    digest: str
    iter_time_s: dict[tuple[int, int], float]
    profiles: dict[int, SensitivityProfile]
    read_at: float


_rates: Rates | None = None
# The longest E_prop a count found inside the window at a priority, per process: (monotonic time,
# priority, the count asked for, E_prop). Jobs ahead of a shorter job are a subset of those ahead of
# it, so a shorter one within INSIDE_REUSE_S goes to the worker without a count (which would scan the
# whole queue to find it inside too). Only ever an undercount: jobs queued since may put it behind.
INSIDE_REUSE_S = 2.0
_inside: tuple[float, int, int, float] | None = None


def swaf_ahead_at_least(job: Job, count: int, policy: SwafPolicy, *, submitted: Sequence[Job] = ()) -> bool:
    """Whether at least `count` pending jobs certainly come before `job` (just submitted, stored) in
    SWAF's order now, among those a forecast orders (not held, none after a dependency that ended
    without completing), `submitted` (the rest of its array) left out; False for a job with a QoS
    target or an own command (the worker's)."""
    if job.workload_id is None or count <= 0:
        return False
    global _rates
    for _ in range(2):
        rates = _rates
        if rates is None or job.num_gpus not in {n for _, n in rates.iter_time_s}:
            rates = _rates = _rates_read(extra_gpus=job.num_gpus)
        if job.workload_id not in rates.profiles:
            return False  # a workload created after the table: read again at the next submission
        tail = policy.submitted_tail_ahead(_view(job, rates.profiles[job.workload_id]))
        if tail is None or _known_inside(tail, count):
            return False
        digest, ahead = _count_ahead(job, count, tail, rates, [job.pk, *(j.pk for j in submitted)])
        if digest == rates.digest:
            if time.monotonic() - rates.read_at > GPU_COUNTS_REUSE_S:
                _rates = None  # the GPU counts read again at the next submission
            if not ahead:
                _inside_note(tail, count)
            return ahead
        _rates = None  # the catalog changed since the table was built: build it again
    return False


def rates_forget() -> None:
    """Build the table again and count again at the next submission (tests)."""
    global _rates, _inside
    _rates = _inside = None


def _known_inside(tail: TailAhead, count: int) -> bool:
    """Whether a count within INSIDE_REUSE_S found a job of this priority, at least as long, inside."""
    inside = _inside
    if inside is None or not 0 <= time.monotonic() - inside[0] < INSIDE_REUSE_S:
        return False
    return inside[1:3] == (tail.priority, count) and tail.proportional_s <= inside[3]


def _inside_note(tail: TailAhead, count: int) -> None:
    global _inside
    if _known_inside(tail, count):
        return  # keep the longer one, and its time
    _inside = (time.monotonic(), tail.priority, count, tail.proportional_s)


def _view(job: Job, profile: SensitivityProfile) -> JobView:
    """The new job as a round sees it (selectors/rounds.py's round_inputs), as far as its order needs."""
    deadline = job.deadline_at
    return JobView(
        job_id=job.pk,
        num_gpus=job.num_gpus,
        arrival_s=job.submitted_at.timestamp(),
        profile=job_profile(profile, job.num_gpus),
        total_iters=float(job.total_iters or 1),
        done_iters=float(job.done_iters if job.total_iters else 0),
        deadline_s=None if deadline is None else deadline.timestamp(),
        priority=job.priority,
        min_rate_iters_per_s=job.qos_min_rate_iters_per_s,
    )


def _digest_sql() -> str:
    """The catalog's rows' ids and versions: any insert, update or delete changes it (an UPDATE writes
    a new row version, with the writing transaction's id as its xmin), for less than serialising the
    rows' JSON (a tenth of a millisecond against half of one for 12 workloads)."""
    table = connection.ops.quote_name(Workload._meta.db_table)
    return (
        "SELECT md5(coalesce(string_agg(w.id::text || ':' || w.xmin::text, ',' ORDER BY w.id), '')) "
        f"FROM {table} w"
    )


def _rates_read(*, extra_gpus: int) -> Rates:
    """The table from the catalog as it is now (its digest read first: rows changed in between make
    the next count's digest differ, and the table is built again) and the pending jobs' GPU counts."""
    with connection.cursor() as cursor:
        cursor.execute(_digest_sql())
        digest = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT DISTINCT num_gpus FROM {Job._meta.db_table} WHERE state = %s", [JobState.PENDING]
        )
        gpus = {row[0] for row in cursor.fetchall()} | {extra_gpus}
    profiles = {}
    for workload in Workload.objects.all():
        # As round_inputs gives a job its profile: the workload's, or a proportional one without a
        # sensitivity matrix (its seconds per iteration the workload's own).
        profile = workload_profile(workload)
        if profile is None:
            profile = proportional_profile(
                REFERENCE_SHAPE, name=workload.name, iter_time_s=workload.iter_time_s
            )
        profiles[workload.pk] = profile
    iter_time_s = {
        (workload_id, n): job_profile(profile, n).iter_time_s
        for workload_id, profile in profiles.items()
        for n in sorted(gpus)
    }
    return Rates(digest=digest, iter_time_s=iter_time_s, profiles=profiles, read_at=time.monotonic())


def _count_ahead(job: Job, count: int, tail: TailAhead, rates: Rates, own: list[int]) -> tuple[str, bool]:
    """The catalog's digest now, and whether at least `count` pending jobs are ahead of `job` by
    `tail` with the table's rates: one statement that stops at the count-th, read through the pending
    jobs' partial indexes (migration 0026), whatever the queue's length."""
    groups = [(key, rate) for key, rate in rates.iter_time_s.items() if rate > 0]
    below_iters = [tail.proportional_s / rate * (1 - REL_MARGIN) for _, rate in groups]
    never = [state for state in TERMINAL_JOB_STATES if state != JobState.COMPLETED]
    with connection.cursor() as cursor:
        cursor.execute(
            _count_sql(),
            {
                "workloads": [workload_id for (workload_id, _), _ in groups],
                "gpus": [n for (_, n), _ in groups],
                "below": below_iters,
                "cut": [_iters_cut(below) for below in below_iters],
                "priority": tail.priority,
                "own": own,
                "never": never,
                "offset": count - 1,
                "limit": count,
            },
        )
        digest, ahead = cursor.fetchone()
    return digest, bool(ahead)


def _iters_cut(below: float) -> int:
    """The least whole number of iterations not below `below` (a bigint): total_iters < cut exactly
    when total_iters < below, so an index range on total_iters finds the jobs short enough."""
    return min(math.ceil(below), BIGINT_MAX) if below < BIGINT_MAX else BIGINT_MAX


@cache
def _count_sql() -> str:
    """The jobs ahead, in four disjoint parts, each an index range on the pending jobs (migration
    0026's partial indexes: their predicates written out, not parameters, so that a prepared
    statement's generic plan uses them too): every job of a higher priority; at its priority, the jobs
    with a QoS target; for each (workload, GPU count), the jobs without one shorter than the threshold
    by total_iters (a range: for them total_iters - done_iters is below it too, still checked), at
    most `count` each in the index's order, so that each is read from that index whatever the
    statistics say; and the jobs that have run (started_at
    set: done_iters is above 0 only once a job has started) and are shorter by what is left of them
    than by total_iters. In each, held jobs, the new ones and those after a dependency that ended
    without completing are left out, as before."""
    jobs, after = Job._meta.db_table, Job.depends_on.through._meta.db_table
    pending = (
        f"j.state = '{JobState.PENDING}' AND NOT j.held AND j.id <> ALL(%(own)s) "
        f"AND NOT EXISTS (SELECT 1 FROM {after} x JOIN {jobs} d ON d.id = x.to_job_id "
        "WHERE x.from_job_id = j.id AND d.state = ANY(%(never)s))"
    )
    qos = (
        "j.qos_deadline_at IS NOT NULL OR j.qos_max_latency_s IS NOT NULL "
        "OR j.qos_min_rate_iters_per_s IS NOT NULL"
    )
    no_qos = (
        "j.qos_deadline_at IS NULL AND j.qos_max_latency_s IS NULL AND j.qos_min_rate_iters_per_s IS NULL"
    )
    groups = (
        "unnest(%(workloads)s::bigint[], %(gpus)s::integer[], %(below)s::float8[], %(cut)s::bigint[]) "
        "AS g(w, n, below, cut)"
    )
    return (
        f"SELECT ({_digest_sql()}), EXISTS (SELECT 1 FROM ("
        f"SELECT j.id FROM {jobs} j WHERE {pending} AND j.priority > %(priority)s "
        f"UNION ALL SELECT j.id FROM {jobs} j WHERE {pending} AND j.priority = %(priority)s AND ({qos}) "
        f"UNION ALL SELECT j.id FROM {groups} CROSS JOIN LATERAL (SELECT j.id FROM {jobs} j "
        f"WHERE {pending} AND j.priority = %(priority)s AND j.workload_id = g.w AND j.num_gpus = g.n "
        f"AND j.total_iters < g.cut AND j.total_iters - j.done_iters < g.below AND {no_qos} "
        "ORDER BY j.total_iters LIMIT %(limit)s) j "
        f"UNION ALL SELECT j.id FROM {jobs} j JOIN {groups} ON g.w = j.workload_id AND g.n = j.num_gpus "
        f"WHERE {pending} AND j.started_at IS NOT NULL AND j.priority = %(priority)s "
        f"AND j.total_iters >= g.cut AND j.total_iters - j.done_iters < g.below AND {no_qos}"
        ") a OFFSET %(offset)s LIMIT 1)"
    )
