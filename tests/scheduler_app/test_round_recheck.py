"""round_plan_recheck: which decisions a round skips when jobs changed while it computed its plan."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.utils import timezone

from scheduler_app.core.reasons import INSUFFICIENT_GPUS
from scheduler_app.core.types import Decision, Outcome, Placement, ServerShare
from scheduler_app.models import JobState, PendingReason
from scheduler_app.selectors import ActiveLease, JobNow, RoundInputs
from scheduler_app.services import round_apply


def job(job_id: int, state: str = JobState.RUNNING) -> SimpleNamespace:
    reason = PendingReason.NONE if state == JobState.RUNNING else PendingReason.RESOURCES
    return SimpleNamespace(pk=job_id, id=job_id, state=state, held=False, pending_reason=reason, num_gpus=1)


def lease(allocation_id: int, job_id: int, server_id: int) -> ActiveLease:
    return ActiveLease(allocation_id, job_id, server_id, 3, 60.0, 1.0, (allocation_id,), (0,))


def placed(job_id: int, server_id: int) -> Decision:
    share = ServerShare(server_id, (0,), 3, 60.0)
    return Decision(job_id, Outcome.PLACED, "", Placement(job_id, (share,), 1.0))


def inputs_of(jobs: list[SimpleNamespace], leases: list[ActiveLease]) -> RoundInputs:
    by_job: dict[int, list[ActiveLease]] = {}
    for held in leases:
        by_job.setdefault(held.job_id, []).append(held)
    return RoundInputs(
        snapshot=None, views=[], jobs={j.pk: j for j in jobs}, leases_by_job=by_job, gpu_ids={}
    )  # type: ignore[arg-type]


def as_read(inputs: RoundInputs, **changed: JobNow) -> dict[int, JobNow]:
    """The rows as round_jobs_recheck reads them: as the plan read them, but for `changed` (by 'jN')."""
    rows = {}
    for job_id, j in inputs.jobs.items():
        held = inputs.leases_by_job.get(job_id, [])
        rows[job_id] = JobNow(
            j.state, j.held, frozenset(x.allocation_id for x in held), frozenset(x.server_id for x in held)
        )
    for name, row in changed.items():
        rows[int(name[1:])] = row
    return rows


@pytest.fixture
def recheck(monkeypatch):
    def run(
        inputs: RoundInputs, decisions: list[Decision], rows: dict[int, JobNow]
    ) -> tuple[set[int], set[int]]:
        asked: set[int] = set()

        def fake_recheck(job_ids):
            asked.update(job_ids)
            return {i: rows[i] for i in job_ids if i in rows}

        monkeypatch.setattr(round_apply, "round_jobs_recheck", fake_recheck)
        return round_apply.round_plan_recheck(inputs, tuple(decisions), all_gpus=64), asked

    return run


def test_only_the_jobs_the_plan_writes_are_locked_and_nothing_is_skipped_when_nothing_changed(recheck):
    inputs = inputs_of([job(1), job(2), job(3, JobState.PENDING)], [lease(11, 1, 100), lease(12, 2, 200)])
    decisions = [
        placed(1, 100),  # kept: the same share as its lease
        placed(2, 300),  # moved
        placed(3, 200),  # started where job 2 was
    ]
    skipped, asked = recheck(inputs, decisions, as_read(inputs))
    assert asked == {2, 3}  # job 1's lease continues: its row is neither written nor locked
    assert skipped == set()


def test_a_job_that_ended_meanwhile_is_skipped_and_the_gpus_it_released_stay_given(recheck):
    inputs = inputs_of([job(1), job(2, JobState.PENDING)], [lease(11, 1, 100)])
    decisions = [placed(1, 300), placed(2, 100)]  # job 1 moves away; job 2 takes its place
    ended = JobNow(JobState.COMPLETED, False, frozenset(), frozenset())
    skipped, _ = recheck(inputs, decisions, as_read(inputs, j1=ended))
    assert skipped == {1}  # its lease ended with it: server 100 is free for job 2


def test_a_job_that_changed_but_still_holds_its_lease_keeps_others_off_that_server_in_cascade(recheck):
    inputs = inputs_of(
        [job(1), job(2, JobState.PENDING), job(3), job(4, JobState.PENDING), job(5)],
        [lease(11, 1, 100), lease(13, 3, 300), lease(15, 5, 500)],
    )
    decisions = [
        placed(1, 200),  # moves away from 100, but was cancelled meanwhile, its lease still active
        placed(2, 100),  # counted on 100 being free: skipped
        placed(3, 100),  # also moves onto 100: skipped, so its lease on 300 stays ...
        placed(4, 300),  # ... and this start on 300 is skipped too
        placed(5, 600),  # elsewhere: applied
    ]
    stopping = JobNow(JobState.CANCELLED, False, frozenset({11}), frozenset({100}))
    skipped, _ = recheck(inputs, decisions, as_read(inputs, j1=stopping))
    assert skipped == {1, 2, 3, 4}


def test_a_job_gone_or_given_a_hold_is_skipped(recheck):
    inputs = inputs_of([job(1, JobState.PENDING), job(2, JobState.PENDING)], [])
    rows = as_read(inputs, j2=JobNow(JobState.PENDING, True, frozenset(), frozenset()))
    del rows[1]
    skipped, _ = recheck(inputs, [placed(1, 100), placed(2, 200)], rows)
    assert skipped == {1, 2}


def test_skipping_a_waiting_job_changes_no_other_jobs_pending_reason():
    """A skipped job still counts as waiting ahead: the job behind it keeps Priority, as the plan said,
    rather than being written with Resources (its row was not locked: only the plan's writes are)."""
    inputs = inputs_of([job(1, JobState.PENDING), job(2, JobState.PENDING)], [])
    inputs.jobs[2].pending_reason = PendingReason.PRIORITY
    waits = [Decision(1, Outcome.PENDING, INSUFFICIENT_GPUS), Decision(2, Outcome.PENDING, INSUFFICIENT_GPUS)]
    writes = round_apply._plan_writes(None, inputs, tuple(waits), now=timezone.now(), names={}, all_gpus=64)
    assert writes.written_job_ids == set()  # job 1 keeps Resources, job 2 Priority
    skipped = round_apply._plan_writes(
        None, inputs, tuple(waits), now=timezone.now(), names={}, all_gpus=64, skipped={1}
    )
    assert skipped.written_job_ids == set() and [d[0] for d in skipped.round_decisions] == [2]
