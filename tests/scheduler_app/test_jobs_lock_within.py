"""An exit's jobs locked within a bounded wait with their workloads, in one statement
(services/report_rows.py `jobs_lock_within`): the same jobs and workloads as `jobs_lock`, the wait's
bound kept by the transaction, and a held row given up after it."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError, connection, transaction
from django.forms.models import model_to_dict

from scheduler_app.models import JobState
from scheduler_app.selectors.agent_reports import jobs_lock
from scheduler_app.services.report_rows import jobs_lock_within
from tests.factories import JobFactory

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="lock_timeout and FOR NO KEY UPDATE"),
]


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


@pytest.mark.django_db
def test_the_jobs_and_their_workloads_are_those_jobs_lock_reads():
    with_workload = JobFactory(state=JobState.RUNNING, checkpoint_every_s=300.0)
    without = JobFactory(state=JobState.RUNNING, workload=None, command="python train.py")
    ids = [without.pk, with_workload.pk, 10**9]  # an unknown id is left out, as by jobs_lock
    with transaction.atomic():
        expected = jobs_lock(job_ids=ids)
    with transaction.atomic():
        jobs = jobs_lock_within(job_ids=ids, lock_wait_ms=100)
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "100ms"  # the transaction keeps the bound, as SET LOCAL did
    assert list(jobs) == sorted([with_workload.pk, without.pk]) == list(expected)
    for pk, job in jobs.items():
        assert _fields(job) == _fields(expected[pk])
    assert jobs[without.pk].workload is None
    workload = jobs[with_workload.pk].workload
    assert workload.pk == with_workload.workload_id
    assert model_to_dict(workload) == model_to_dict(expected[with_workload.pk].workload)
    assert _fields(workload) == _fields(expected[with_workload.pk].workload)
    assert jobs_lock_within(job_ids=[], lock_wait_ms=100) == {}


@pytest.mark.django_db(transaction=True)
def test_a_job_another_transaction_holds_is_given_up_after_the_wait():
    """The bound is set before the lock is asked for: the wait ends after about `lock_wait_ms`."""
    job = JobFactory(state=JobState.RUNNING)
    locked, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                jobs_lock(job_ids=[job.pk])
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        with pytest.raises(OperationalError) as failed, transaction.atomic():
            jobs_lock_within(job_ids=[job.pk], lock_wait_ms=200)
        waited_s = time.monotonic() - started
        assert failed.value.__cause__.pgcode == "55P03"  # lock_not_available
        assert 0.15 < waited_s < 5
    finally:
        release.set()
        thread.join(30)
    with transaction.atomic():
        assert list(jobs_lock_within(job_ids=[job.pk], lock_wait_ms=200)) == [job.pk]
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"  # the bound went with its transaction, as SET LOCAL's
