"""Time limits: a running job that has held its resources for its `time_limit_s` ends as TIMEOUT."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler_app.models import Allocation, Job, JobEvent, JobState
from scheduler_app.services.job_control import jobs_time_limit_enforce
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, make_server, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_tune")]


def started_ago(job: Job, seconds: float) -> None:
    Allocation.objects.filter(job=job).update(started_at=timezone.now() - timedelta(seconds=seconds))


def test_a_job_past_its_limit_times_out_and_others_keep_running(user):
    make_server("n1", gpus=4)
    limited = submit(user, gpus=2, name="limited", time_limit_s=3600)
    young = submit(user, gpus=1, name="young", time_limit_s=3600)
    unlimited = submit(user, gpus=1, name="unlimited")
    scheduling_round_run(trigger="test")
    started_ago(limited, 3601)  # both its leases (2 GPUs, one server) count once
    started_ago(young, 600)
    started_ago(unlimited, 10**6)
    assert jobs_time_limit_enforce() == [limited.pk]
    for job in (limited, young, unlimited):
        job.refresh_from_db()
    assert limited.state == JobState.TIMEOUT and limited.finished_at is not None
    assert not active(limited)
    event = JobEvent.objects.filter(job=limited).order_by("at", "id").last()
    assert (event.kind, event.reason) == ("timeout", "time_limit")
    assert young.state == JobState.RUNNING and unlimited.state == JobState.RUNNING
    assert jobs_time_limit_enforce() == []


def test_time_paused_by_preemption_is_not_charged(user):
    make_server("n1", gpus=1)
    job = submit(user, gpus=1, name="paused", time_limit_s=3600)
    scheduling_round_run(trigger="test")
    now = timezone.now()
    # It ran 40 min, was paused for 2 h, and has run 10 min since: 50 min < 60 min.
    first = Allocation.objects.get(job=job)
    Allocation.objects.create(
        job=job,
        server=first.server,
        round=first.round,
        num_gpus=first.num_gpus,
        num_cpus=first.num_cpus,
        mem_gb=first.mem_gb,
        speedup=1.0,
        started_at=now - timedelta(hours=2, minutes=50),
        ended_at=now - timedelta(hours=2, minutes=10),
        end_reason="preempted",
    )
    Allocation.objects.filter(pk=first.pk).update(started_at=now - timedelta(minutes=10))
    assert jobs_time_limit_enforce(now=now) == []
    assert jobs_time_limit_enforce(now=now + timedelta(minutes=11)) == [job.pk]
