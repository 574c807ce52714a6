"""One forecast: every page, the API and the queue show the estimate stored after rounds, in wall time."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from cluster_app.models import Server
from scheduler_app.models import Allocation, Job, JobForecast, JobState
from scheduler_app.selectors import job_queue
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.job_control import job_cancel, job_requeue
from scheduler_app.services.jobs import JobRequest, job_submit
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import earlier_lease, lease_of, submit, workload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def round_then_refresh() -> None:
    """A round, then the refresh it asks the forecasts worker for (services/forecast_refresh.py)."""
    scheduling_round_run()
    job_forecasts_refresh()


def test_the_refresh_after_a_round_stores_every_live_jobs_estimate_and_drops_ended_ones(user, gpu01_res18):
    running = submit(user, gpus=4, iters=1000)
    waiting = submit(user, gpus=4, iters=1000)
    round_then_refresh()
    forecasts = {f.job_id: f for f in JobForecast.objects.all()}
    assert set(forecasts) == {running.pk, waiting.pk}
    # The second job starts when the first ends: one forecast, the same numbers.
    assert forecasts[waiting.pk].start_at >= forecasts[running.pk].finish_at
    job_cancel(job=Job.objects.get(pk=waiting.pk), by=user)
    round_then_refresh()
    assert set(JobForecast.objects.values_list("job_id", flat=True)) == {running.pk}


def test_a_fake_nodes_time_scale_makes_the_forecast_that_much_shorter(user, gpu01_res18):
    iter_s = workload("res18").iter_time_s
    job = submit(user, gpus=1, iters=1000)
    job_forecasts_refresh()
    real = JobForecast.objects.get(job=job)
    Server.objects.update(time_scale=0.05)  # the demo's agents: synthetic jobs 20 times faster
    job_forecasts_refresh()
    fake = JobForecast.objects.get(job=job)
    # A start waits the workload's start-up (docs/restarts.md), in the job's own time like its work.
    startup_s = workload("res18").startup_s
    assert (real.finish_at - real.start_at).total_seconds() == pytest.approx(
        startup_s + 1000 * iter_s, rel=0.01
    )
    assert (fake.finish_at - fake.start_at).total_seconds() == pytest.approx(
        (startup_s + 1000 * iter_s) * 0.05, rel=0.01
    )


def test_an_own_command_sized_by_its_time_limit_lasts_that_limit_on_a_fake_node_too(user, gpu01_res18):
    # The time limit is enforced in wall time on every node (jobs_time_limit_enforce), so a fake
    # node's time scale does not shorten it: the job behind it starts once the limit has passed.
    Server.objects.update(time_scale=0.05)
    first = submit(user, gpus=4, iters=None, command="python train.py", time_limit_s=600)
    second = submit(user, gpus=4, iters=None, command="python train.py", time_limit_s=600)
    round_then_refresh()
    forecasts = {f.job_id: f for f in JobForecast.objects.all()}
    assert forecasts[second.pk].start_at >= Job.objects.get(pk=first.pk).started_at + timedelta(seconds=600)
    assert forecasts[second.pk].finish_at - forecasts[second.pk].start_at == timedelta(seconds=600)


def test_a_running_job_finishes_at_the_speed_its_agent_measures(user, gpu01_res18):
    job = submit(user, gpus=1, iters=1000)
    scheduling_round_run()
    Job.objects.filter(pk=job.pk).update(done_iters=400)
    Allocation.objects.filter(pk=lease_of(job).pk).update(iters_per_s=2.0)  # 600 left: 300 s
    now = timezone.now()
    job_forecasts_refresh(now=now)
    finish = JobForecast.objects.get(job=job).finish_at
    # It finishes inside a round at its exact time; the forecast's rounds start at the next one (60 s).
    assert now + timedelta(seconds=300) <= finish <= now + timedelta(seconds=300 + 61)


def test_a_job_whose_time_limit_ends_it_first_finishes_there_and_frees_its_gpus(user, gpu01_res18):
    # 600 iterations left at 2 a second: 300 s of work, but 120 s of its 1,000 s limit left (it has run
    # 880 s, 300 of them on an earlier lease): the service ends it then (TIMEOUT), and so does the
    # forecast: the job waiting for its GPUs starts in the round after, not once its work would be
    # done. One with time to spare keeps the forecast's finish.
    job = submit(user, gpus=2, iters=1000, time_limit_s=1000)
    spare = submit(user, gpus=2, iters=1000, time_limit_s=10_000)
    behind = submit(user, gpus=2, iters=100)
    scheduling_round_run()
    now = timezone.now()
    for each in (job, spare):
        Job.objects.filter(pk=each.pk).update(done_iters=400)
        Allocation.objects.filter(job=each, ended_at__isnull=True).update(
            iters_per_s=2.0, started_at=now - timedelta(seconds=580)
        )
    an_hour_ago = now - timedelta(hours=1)
    earlier_lease(job, started_at=an_hour_ago, ended_at=an_hour_ago + timedelta(seconds=300))
    job_forecasts_refresh(now=now)
    limited, free, waiting = (JobForecast.objects.get(job=each) for each in (job, spare, behind))
    assert limited.finish_at == now + timedelta(seconds=120)
    assert "time limit" in limited.detail
    assert now + timedelta(seconds=300) <= free.finish_at <= now + timedelta(seconds=300 + 61)
    assert free.detail == ""
    # The rounds are a minute apart: it starts in the first round after the limit.
    assert now + timedelta(seconds=120) <= waiting.start_at <= now + timedelta(seconds=120 + 61)


def test_a_requeued_job_is_estimated_to_start_again_not_at_its_first_start(user, gpu01_res18):
    job = submit(user, gpus=4, iters=1000)
    scheduling_round_run()
    first_start = Job.objects.get(pk=job.pk).started_at
    assert first_start is not None
    later = first_start + timedelta(minutes=5)
    job_requeue(job=Job.objects.get(pk=job.pk), reason="node_down", now=later)
    requeued = Job.objects.get(pk=job.pk)
    # Its first start stays in its history (started_at), as before.
    assert requeued.state == JobState.PENDING and requeued.started_at == first_start
    job_forecasts_refresh(now=later)
    estimate = JobForecast.objects.get(job=job)
    # Its next start, at the forecast's first round or after: not the start it had before (in the past).
    assert estimate.start_at is not None and estimate.start_at >= later
    assert estimate.finish_at > estimate.start_at


def test_the_queue_the_api_and_the_job_page_show_the_same_estimate(user, gpu01_res18, client):
    submit(user, gpus=4, iters=1000)
    job = submit(user, gpus=4, iters=500)
    round_then_refresh()
    stored = JobForecast.objects.get(job=job)
    entry = job_queue()[job.pk]
    listed = next(j for j in api(user).get("/api/v1/jobs/").json()["results"] if j["id"] == job.pk)
    detail = api(user).get(f"/api/v1/jobs/{job.pk}/").json()
    assert entry.estimated_start_at == stored.start_at and entry.estimated_finish_at == stored.finish_at
    for body in (listed, detail):
        assert at(body["estimated_start_at"]) == stored.start_at
        assert at(body["estimated_finish_at"]) == stored.finish_at
    client.force_login(user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    queue = client.get("/jobs/").content.decode()
    shown = timezone.localtime(stored.finish_at).strftime("%Y-%m-%d %H:%M")
    assert (
        f'id="estimated-finish"><time datetime="{timezone.localtime(stored.finish_at):%Y-%m-%dT%H:%M:%S}'
        in page
    )
    assert shown in page and shown in queue.split(f'<tr id="job-{job.pk}"')[1].split("</tr>")[0]


def test_a_job_behind_an_unsized_own_command_gets_no_start_rather_than_a_guess(user, gpu01_res18):
    submit(user, gpus=4, iters=100, command="python train.py")  # no measure, no time limit
    scheduling_round_run()
    behind = submit(user, gpus=1, iters=10)
    job_forecasts_refresh()
    forecast = JobForecast.objects.get(job=behind)
    assert forecast.start_at is None and "not started within" in forecast.detail
    assert Job.objects.get(pk=behind.pk).state == JobState.PENDING


def test_the_refresh_stores_the_policys_order_and_a_submission_takes_its_place_at_once(
    user, gpu01_res18, settings
):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "srtf"}
    submit(user, gpus=4, iters=1000, name="running")  # holds gpu01's 4 GPUs
    long = submit(user, gpus=4, iters=9000, name="long")
    short = submit(user, gpus=4, iters=3000, name="short")
    round_then_refresh()
    # SRTF: the shorter job first, whatever the submission order.
    assert {k: e.position for k, e in job_queue().items()} == {short.pk: 1, long.pk: 2}
    # A still shorter job goes first at its submission (admission, as the API and the form submit); the
    # two behind it move down one place.
    request = JobRequest(name="shortest", num_gpus=4, total_iters=2000, workload=workload("res18"))
    (shortest,) = job_submit(owner=user, request=request)
    positions = {k: e.position for k, e in job_queue().items()}
    assert positions == {shortest.pk: 1, short.pk: 2, long.pk: 3}
    assert job_queue(job_ids=[long.pk]) == {long.pk: job_queue()[long.pk]}


def test_jobs_the_round_cannot_consider_come_last_in_submission_order(user, gpu01_res18):
    held = submit(user, gpus=4, iters=1000, name="held", hold=True)
    first = submit(user, gpus=4, iters=1000, name="first")
    held_too = submit(user, gpus=4, iters=1000, name="held-too", hold=True)
    second = submit(user, gpus=4, iters=1000, name="second")
    job_forecasts_refresh()
    positions = {k: e.position for k, e in job_queue().items()}
    assert positions == {first.pk: 1, second.pk: 2, held.pk: 3, held_too.pk: 4}


def test_a_forecast_cut_short_by_its_budget_still_says_how_late_at_the_earliest(
    user, gpu01_res18, monkeypatch, settings
):
    """A forecast that runs out of its budget before a job starts answers with the lower bound it
    has (the time of the round it would have played next), which the whole forecast respects. Under
    swaf + genie with a deadline that can still be met, whose rounds are played one by one (FIFO's
    forecast, and swaf's without such deadlines, jump to the next finish)."""
    from types import SimpleNamespace

    from scheduler_app.services import forecasts

    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "swaf", "allocator": "genie"}

    submit(user, gpus=4, iters=50_000, qos_deadline_at=timezone.now() + timedelta(days=20))
    waiting = submit(user, gpus=4, iters=100_000)  # longer: it waits for the first under swaf too
    scheduling_round_run()
    now = timezone.now()
    whole = forecasts.live_forecast(now=now, budget_s=60.0)[waiting.pk]
    assert whole.start_at is not None and not whole.cut_short
    ticks = iter(range(1_000_000))  # a wall clock that moves 1 s each time it is read: 3 rounds
    monkeypatch.setattr(forecasts, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    cut = forecasts.live_forecast(now=now, budget_s=3.5)[waiting.pk]
    assert cut.cut_short and cut.start_at is None
    assert cut.detail.startswith("starts after ") and cut.detail.endswith(
        "at the earliest (as far as 3.5 s of forecasting played)"
    )
    shown = cut.detail.split(" at the earliest")[0][len("starts after ") :]
    earliest = datetime.strptime(shown, "%Y-%m-%d %H:%M")
    earliest = timezone.make_aware(earliest, timezone.get_current_timezone())
    assert now < earliest + timedelta(minutes=1)  # the minute shown holds the fourth round's time
    assert earliest <= whole.start_at
