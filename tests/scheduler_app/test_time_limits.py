"""Time limits: a running job that has held its resources for its `time_limit_s` ends as TIMEOUT."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler_app.models import Allocation, Job, JobEvent, JobState
from scheduler_app.services.job_control import jobs_time_limit_enforce
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, earlier_lease, make_server, submit

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
    earlier_lease(
        job, started_at=now - timedelta(hours=2, minutes=50), ended_at=now - timedelta(hours=2, minutes=10)
    )
    Allocation.objects.filter(pk=first.pk).update(started_at=now - timedelta(minutes=10))
    assert jobs_time_limit_enforce(now=now) == []
    assert jobs_time_limit_enforce(now=now + timedelta(minutes=11)) == [job.pk]


def test_the_embedded_demos_loop_ends_a_job_past_its_limit_as_the_beat_does(user, monkeypatch):
    # The demo has no Celery beat: its own loop runs the round and the periodic sweep, time limits
    # included (it used to run only the liveness half, so a demo job never timed out).
    import threading

    from scheduler_app.management.commands import demo

    make_server("n1", gpus=4)
    limited = submit(user, gpus=1, name="limited", time_limit_s=60)
    scheduling_round_run(trigger="test")
    started_ago(limited, 61)
    stop = threading.Event()

    def one_round(**kwargs):
        stop.set()  # the loop ends after this pass

    monkeypatch.setattr(demo, "scheduling_round_run", one_round)
    monkeypatch.setattr(demo, "close_old_connections", lambda: None)  # the test's own transaction
    demo.Command()._rounds(stop, round_s=0.01)
    limited.refresh_from_db()
    assert limited.state == JobState.TIMEOUT
