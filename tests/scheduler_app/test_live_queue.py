"""The live queue's jobs read without Model.__init__ (services/live_queue.py): the ORM's, field by field."""

from datetime import timedelta

import pytest
from django.db.models import signals
from django.utils import timezone

from scheduler_app.models import Job, JobState
from scheduler_app.services.live_queue import live_jobs
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]


def orm_live_jobs() -> dict[int, Job]:
    return {j.pk: j for j in Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING])}


def fields(job: Job) -> dict:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@pytest.fixture
def queue(user, gpu01_res18):
    """Running and pending catalog jobs, a held one, an own command, one with a deadline, one ended."""
    running = submit(user, gpus=4, iters=1000)
    submit(user, gpus=4, iters=5000)
    held = submit(user, gpus=1, iters=100)
    Job.objects.filter(pk=held.pk).update(held=True, qos_deadline_at=timezone.now() + timedelta(hours=1))
    ended = submit(user, gpus=1, iters=100)
    Job.objects.filter(pk=ended.pk).update(state=JobState.CANCELLED)
    submit(user, gpus=1, iters=100, command="sleep 60")
    scheduling_round_run()
    assert Job.objects.get(pk=running.pk).state == JobState.RUNNING


def test_the_live_jobs_are_the_orms_field_by_field_with_their_workloads_read_once(
    queue, django_assert_num_queries
):
    expected = orm_live_jobs()
    with django_assert_num_queries(2):  # the jobs, the catalog
        jobs = live_jobs()
    assert {j.pk for j in jobs} == set(expected) and len(jobs) == len(expected)
    assert {j.state for j in jobs} == {JobState.PENDING, JobState.RUNNING}
    for job in jobs:
        assert type(job) is Job
        assert fields(job) == fields(expected[job.pk])
        assert job == expected[job.pk] and hash(job) == hash(expected[job.pk])
        assert job._state.adding is False and job._state.db == "default"
    with django_assert_num_queries(0):  # each job's workload is the shared one, already there
        names = {j.pk: j.workload.name if j.workload_id else None for j in jobs}
    assert names == {pk: j.workload.name if j.workload_id else None for pk, j in expected.items()}
    assert None in names.values()  # the own command: no workload, no query


def test_a_live_job_saves_and_reloads_as_one_the_orm_read(queue):
    job = next(j for j in live_jobs() if j.state == JobState.PENDING)
    job.priority = 7
    job.save(update_fields=["priority"])
    assert Job.objects.get(pk=job.pk).priority == 7
    job.refresh_from_db()
    assert fields(job) == fields(Job.objects.get(pk=job.pk))


def test_with_a_receiver_on_jobs_init_every_job_is_built_by_the_orm(queue):
    heard = []

    def receiver(sender, instance, **kwargs):
        heard.append(instance.pk)

    signals.post_init.connect(receiver, sender=Job)
    try:
        jobs = live_jobs()
    finally:
        signals.post_init.disconnect(receiver, sender=Job)
    assert sorted(heard) == sorted(j.pk for j in jobs) == sorted(orm_live_jobs())
    assert all(fields(j) == fields(Job.objects.get(pk=j.pk)) for j in jobs)


def test_the_queue_is_read_without_the_collector_which_is_back_after(queue, monkeypatch):
    import gc

    from scheduler_app.services import live_queue as module

    seen = []
    real = module.round_inputs

    def spy(**kwargs):
        seen.append(gc.isenabled())
        return real(**kwargs)

    monkeypatch.setattr(module, "round_inputs", spy)
    assert gc.isenabled()
    module.live_queue()
    assert seen == [False] and gc.isenabled()


def test_the_forecast_prices_restarts_as_the_live_round_does(user, gpu01_res18, monkeypatch):
    """A server whose agent cannot resize in place (live_resize off) is static in the forecast as in
    the live round: a resize there is a restart, not a free change the forecast alone would plan."""
    import scheduler_app.services.forecasts as forecasts
    import scheduler_app.services.rounds as rounds
    from cluster_app.models import Server
    from tests.api.helpers import make_server

    Server.objects.filter(pk=gpu01_res18.pk).update(live_resize=True)
    static = make_server("gpu02", gpus=4, cpus=12, mem_gb=250)
    Server.objects.filter(pk=static.pk).update(live_resize=False)
    submit(user, gpus=4, iters=1000)
    submit(user, gpus=4, iters=1000)
    submit(user, gpus=2, iters=1000)
    seen = {}

    def spy(module, name, label):
        real = getattr(module, name)

        def call(*args, **kwargs):
            seen[label] = kwargs["restarts"]
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    spy(rounds, "schedule_round", "round")
    spy(forecasts, "ForecastRun", "forecast")
    scheduling_round_run()
    forecasts.job_forecasts_refresh()
    assert seen["forecast"] == seen["round"]
    assert seen["forecast"].static_servers == {static.pk}
