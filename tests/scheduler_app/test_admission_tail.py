"""SWAF's submissions behind the forecast's window, answered in their request (services/admission_tail.py):
the count of jobs ahead is the worker's order's, never more, whatever the workloads' profiles."""

from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from profiles_app.models import Workload
from scheduler_app.models import AdmissionPrediction, Job, JobForecast
from scheduler_app.services import (
    admission_tail,
    admission_window,
    admission_worker,
    forecast_store,
    forecasts,
)
from scheduler_app.services.admission_worker import FORECAST_PENDING, admission_forecasts_run
from scheduler_app.services.forecasts import job_forecasts_refresh_estimates
from scheduler_app.services.job_control import job_cancel
from scheduler_app.services.jobs import JobRequest, job_submit
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import submit, workload
from tests.factories import WorkloadFactory

pytestmark = pytest.mark.django_db

ITERS = (300, 1000, 2500, 6000, 20000)


@pytest.fixture
def swaf(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "swaf",
        "allocator": "proportional",
        "inline_rounds": False,
        "round_s": 60,
        "reject_unattainable_qos": False,
        "admission_in_request_max_jobs": 0,
    }
    admission_tail.rates_forget()
    admission_window.window_last_start_forget()
    yield settings
    admission_tail.rates_forget()
    admission_window.window_last_start_forget()


def kinds() -> dict[str, Workload]:
    """res18 (a sensitivity matrix), one without a matrix (its profile missing: the proportional one at
    its own seconds per iteration) and one with a GENIE fit (seconds per iteration by GPU count)."""
    return {
        "res18": workload("res18"),
        "bare": WorkloadFactory(
            name="bare", iter_time_s=0.7, cpu_per_gpu_grid=[], mem_gb_per_gpu_grid=[], tput_matrix=[]
        ),
        "fitted": WorkloadFactory(
            name="fitted", iter_time_s=0.2, genie_alpha_s=0.004, genie_beta_s=0.03, genie_t_intra_s=0.01,
            batch_size=32,
        ),
    }  # fmt: skip


@pytest.fixture
def deep(swaf, user, gpu01_res18):
    """gpu01's 4 GPUs held by a running job; behind it a mixed queue: the three kinds of workload on 1, 2
    and 4 GPUs and five lengths, a QoS job, a higher priority's, a lower one's, two own commands (one
    sized by its time limit), a held job and one after a cancelled job (never starts)."""
    wl = kinds()
    submit(user, gpus=4, iters=100_000, name="running")
    scheduling_round_run()
    for name, w in wl.items():
        for gpus in (1, 2, 4):
            for iters in ITERS[:: 1 + gpus // 2]:
                submit(user, gpus=gpus, iters=iters, workload=w, name=f"{name}-{gpus}-{iters}")
    boss = get_user_model().objects.create_user("boss", is_staff=True)
    submit(user, gpus=1, iters=50_000, name="qos", qos_max_latency_s=7 * 86400)
    submit(boss, gpus=1, iters=90_000, name="urgent", priority=5)
    submit(boss, gpus=1, iters=10, name="low", priority=-1)
    submit(user, gpus=1, iters=5, name="own", command="sleep 1")
    submit(user, gpus=1, iters=5, name="own-limited", command="sleep 1", time_limit_s=10)
    submit(user, gpus=1, iters=5, name="held", workload=wl["res18"], hold=True)
    gone = submit(user, gpus=1, iters=5, name="gone", workload=wl["res18"])
    submit(user, gpus=1, iters=5, name="after-gone", workload=wl["res18"], depends_on=(gone.pk,))
    job_cancel(job=gone, by=user)
    return wl


def worker_ahead(job: Job) -> tuple[int, int]:
    """How many pending jobs come before `job` in the order the forecasts worker plays (live_forecast's
    views, in wall time), and how many of those are own commands (which the request leaves out)."""
    ahead, jobs = worker_ahead_views(job)
    return len(ahead), sum(1 for v in ahead if jobs[v.job_id].workload_id is None)


def worker_ahead_views(job: Job) -> tuple[list, dict[int, Job]]:
    """The pending jobs' views before `job` in the worker's order, and the jobs by id."""
    queue = forecasts.live_queue()
    inputs = queue.inputs
    scale = forecasts.cluster_time_scale(queue.servers)
    views = [
        forecasts._in_wall_time(
            v, inputs.jobs[v.job_id], inputs.leases_by_job.get(v.job_id, ()), scale, inputs.now_s
        )
        for v in inputs.views
    ]
    policy = forecasts.scheduler_conf().policy_obj()
    pending = [
        v for v in policy.order(views, inputs.snapshot, timezone.now().timestamp()) if v.current is None
    ]
    return pending[: [v.job_id for v in pending].index(job.pk)], inputs.jobs


def policy():
    return forecasts.scheduler_conf().policy_obj()


def test_the_count_is_the_workers_order_for_every_kind_of_workload(deep, user):
    """A new job of each kind, GPU count and length: at least k jobs ahead exactly when the worker's
    order has k before it (own commands aside, which the request does not count: fewer, never more)."""
    checked = 0
    for w in deep.values():
        for gpus in (1, 2, 4):
            for iters in (*ITERS, 100, 4000, 30000):
                job = submit(user, gpus=gpus, iters=iters + 1, workload=w, name="new")
                ahead, own = worker_ahead(job)
                for count in range(1, ahead + 3):
                    admission_tail.rates_forget()  # no count reused: each read
                    got = admission_tail.swaf_ahead_at_least(job, count, policy())
                    assert got == (count <= ahead - own), (w.name, gpus, iters, count, ahead, own)
                job_cancel(job=job, by=user)
                checked += 1
    assert checked == 72


def test_a_catalog_changed_since_the_table_was_built_is_read_again(deep, user):
    job = submit(user, gpus=1, iters=2000, workload=deep["bare"], name="new")
    ahead, own = worker_ahead(job)
    assert admission_tail.swaf_ahead_at_least(job, ahead - own, policy())
    # res18's jobs now a hundred times as long per iteration: none of them before the new job.
    Workload.objects.filter(name="res18").update(speed_correction=0.01)
    after, own = worker_ahead(job)
    assert after < ahead
    assert admission_tail.swaf_ahead_at_least(job, after - own, policy())
    assert not admission_tail.swaf_ahead_at_least(job, after - own + 1, policy())


def test_ties_and_the_jobs_it_does_not_count_are_an_undercount(deep, user):
    """A job as long as the new one (it arrived first: ahead in the worker's order) and an own command
    sized by its time limit are not counted: the count is below the worker's, never above."""
    w = deep["res18"]
    job = submit(user, gpus=1, iters=ITERS[1], workload=w, name="new")  # as long as res18-1-1000
    ahead, own = worker_ahead(job)
    assert own == 1
    assert admission_tail.swaf_ahead_at_least(job, ahead - 2, policy())
    assert not admission_tail.swaf_ahead_at_least(job, ahead - 1, policy())


def test_a_shorter_job_just_after_one_found_inside_goes_to_the_worker_without_a_count(deep, user):
    long = submit(user, gpus=1, iters=ITERS[2] + 1, workload=deep["res18"], name="new")
    short = submit(user, gpus=1, iters=ITERS[1] + 1, workload=deep["res18"], name="new2")
    ahead, own = worker_ahead(long)
    assert not admission_tail.swaf_ahead_at_least(long, ahead - own + 1, policy())
    with CaptureQueriesContext(connection) as queries:
        assert not admission_tail.swaf_ahead_at_least(short, ahead - own + 1, policy())
        assert admission_tail.swaf_ahead_at_least(long, 1, policy())  # another count: read
    assert len(queries) == 1


def test_a_job_that_has_run_is_counted_by_what_is_left_of_it(deep, user):
    """A preempted job back in the queue (started before, most of its iterations done) is ahead of a new
    job longer than what is left of it, though its total is longer: the count reads such jobs apart
    from the others, whose totals it compares (migration 0026's indexes)."""
    w = deep["res18"]
    Job.objects.filter(name="res18-1-20000").update(started_at=timezone.now(), done_iters=20000 - 100)
    job = submit(user, gpus=1, iters=ITERS[2] + 1, workload=w, name="new")
    ahead, own = worker_ahead(job)
    assert Job.objects.get(name="res18-1-20000").pk in {v.job_id for v in worker_ahead_views(job)[0]}
    for count in range(1, ahead + 3):
        admission_tail.rates_forget()  # no count reused: each read
        assert admission_tail.swaf_ahead_at_least(job, count, policy()) == (count <= ahead - own), count


def test_a_qos_job_and_an_own_command_are_the_workers(deep, user):
    qos = submit(user, gpus=1, iters=10**7, workload=deep["res18"], name="late", qos_max_latency_s=60)
    own = submit(user, gpus=1, iters=10**7, command="sleep 1", name="own2")
    for job in (qos, own):
        assert not admission_tail.swaf_ahead_at_least(job, 1, policy())


def submit_new(user, **more) -> list[Job]:
    fields = {"name": "new", "num_gpus": 1, "total_iters": 10**6, "workload": workload("res18"), **more}
    with TestCase.captureOnCommitCallbacks(execute=True):
        return job_submit(owner=user, request=JobRequest(**fields))


@pytest.fixture
def asked(swaf, live_redis, monkeypatch):
    """The admission forecasts asked of the worker (not sent); a window of 5 jobs."""
    swaf.ATTUNE_SCHEDULER = {**swaf.ATTUNE_SCHEDULER, "forecast_window_jobs": 5}
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)
    sent = []
    monkeypatch.setattr(admission_worker, "task_send", lambda name, **kwargs: sent.append(name))
    yield sent
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)


def test_a_long_submission_is_answered_in_its_request_as_the_worker_would(deep, user, asked, monkeypatch):
    estimates = job_forecasts_refresh_estimates()  # the window's estimates stored
    (job,) = submit_new(user)
    assert asked == []
    prediction = AdmissionPrediction.objects.get(job=job)
    assert prediction.detail.startswith("queued behind the 5 jobs the forecast plays forward")
    assert prediction.predicted_start_at is None and prediction.attainable is None
    assert not admission_worker.admission_pending(job)
    stored = JobForecast.objects.get(job=job)
    assert stored.detail == prediction.detail and stored.position is None
    last = max(e.start_at for e in estimates.values() if e.start_at is not None)
    assert f"{forecasts.timezone.localtime(last):%Y-%m-%d %H:%M}" in prediction.detail
    # The worker's answer for the same job, word for word, without playing anything forward.
    prediction.detail = FORECAST_PENDING
    prediction.save()
    monkeypatch.setattr(forecasts, "ForecastRun", lambda *a, **k: pytest.fail("played forward"))
    assert admission_forecasts_run() == 1
    assert AdmissionPrediction.objects.get(job=job).detail == stored.detail


def test_an_array_behind_the_window_is_answered_in_its_request(deep, user, asked):
    job_forecasts_refresh_estimates()
    jobs = submit_new(user, array="0-3")
    assert asked == []
    details = set(AdmissionPrediction.objects.filter(job__in=jobs).values_list("detail", flat=True))
    assert len(details) == 1 and details.pop().startswith("queued behind the 5 jobs")


@pytest.mark.parametrize("case", ["short", "qos", "held", "dependency", "higher priority"])
def test_a_submission_that_may_be_inside_the_window_is_the_workers(deep, user, asked, case):
    more: dict = {}
    owner = user
    if case == "short":
        more["total_iters"] = 50
    elif case == "qos":
        more["qos_max_latency_s"] = 30 * 86400
    elif case == "held":
        more["hold"] = True
    elif case == "dependency":
        more["depends_on"] = (Job.objects.get(name="qos").pk,)
    else:
        owner = get_user_model().objects.get(username="boss")
        more["priority"] = 6
    (job,) = submit_new(owner, **more)
    assert AdmissionPrediction.objects.get(job=job).detail == FORECAST_PENDING
    assert asked and admission_worker.admission_pending(job)


def test_the_workers_forecast_of_a_job_inside_the_window_leaves_out_the_jobs_after_it(
    deep, user, asked, monkeypatch
):
    """The admission forecast plays the jobs up to its last target in the policy's order; here the
    target's estimate is the same as with the whole queue (the jobs after it only take what it leaves)."""
    played = []
    real = forecasts.ForecastRun

    def spy(snapshot, views, **kwargs):
        played.append({v.job_id for v in views})
        return real(snapshot, views, **kwargs)

    monkeypatch.setattr(forecasts, "ForecastRun", spy)
    (job,) = submit_new(user, total_iters=50)
    prediction = AdmissionPrediction.objects.get(job=job)
    assert prediction.detail == FORECAST_PENDING
    now = timezone.now()
    answers = []
    with mock.patch("django.utils.timezone.now", return_value=now):
        assert admission_forecasts_run() == 1
        answers.append(AdmissionPrediction.objects.get(job=job))
        prediction.save()  # pending again
        # The whole queue played: nothing left out.
        monkeypatch.setattr(forecasts, "_window", lambda placeable, views, *a, **k: (placeable, [], views))
        assert admission_forecasts_run() == 1
        answers.append(AdmissionPrediction.objects.get(job=job))
    cut, whole = played
    assert job.pk in cut and cut < whole
    assert Job.objects.get(name="res18-1-20000").pk in whole - cut
    assert answers[0].predicted_start_at is not None and answers[0].predicted_finish_at is not None
    assert (answers[0].predicted_start_at, answers[0].predicted_finish_at, answers[0].detail) == (
        answers[1].predicted_start_at,
        answers[1].predicted_finish_at,
        answers[1].detail,
    )


@pytest.mark.parametrize("postgresql", [True, False], ids=["postgresql", "portable"])
def test_positions_are_stored_where_they_changed(deep, monkeypatch, postgresql):
    if not postgresql:
        monkeypatch.setattr(forecast_store, "is_postgresql", lambda: False)
    job_forecasts_refresh_estimates()
    stored = dict(JobForecast.objects.values_list("job_id", "position"))
    assert forecasts.job_positions_store(stored) == 0
    moved = {job_id: (position or 0) + 1 for job_id, position in stored.items()}
    assert forecasts.job_positions_store({**moved, 10**9: 1}) == len(moved)
    assert dict(JobForecast.objects.values_list("job_id", "position")) == moved
