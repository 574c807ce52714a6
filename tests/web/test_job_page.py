"""A job's page: permissions, schedule, timeline, leases with speeds, log tail, cancel."""

import pytest
from django.utils import timezone

from profiles_app.models import SpeedObservation, Workload
from scheduler_app.models import AdmissionPrediction, Job, JobState
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.job_lifecycle import NEW, job_event_append, job_events_record, transition_event
from scheduler_app.web import views
from tests.factories import UserFactory
from tests.web.conftest import pending_array, pending_job, running_job

pytestmark = pytest.mark.django_db


def test_another_users_job_shows_its_summary_and_cannot_be_cancelled(user, client_of, cluster):
    job = pending_job(UserFactory(), command="echo their-secret", workload=None, time_limit_s=600)
    client = client_of(user)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"Job {job.pk}: {job.name}" in html and 'id="details-hidden"' in html
    assert "their-secret" not in html and 'id="cancel-job"' not in html and 'id="hold-job"' not in html
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.PENDING


def test_private_jobs_makes_another_users_job_a_404(user, client_of, cluster, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "private_jobs": True}
    job = pending_job(UserFactory())
    assert client_of(user).get(f"/jobs/{job.pk}/").status_code == 404


def test_staff_see_and_cancel_anyones_job(staff_user, client_of, cluster):
    job = pending_job(UserFactory())
    client = client_of(staff_user)
    assert client.get(f"/jobs/{job.pk}/").status_code == 200
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_the_owner_cancels_with_a_post_only(
    user, client_of, cluster, no_rounds, django_capture_on_commit_callbacks
):
    job = pending_job(user)
    client = client_of(user)
    assert client.get(f"/jobs/{job.pk}/cancel/").status_code == 405
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/jobs/{job.pk}/cancel/", follow=True)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and no_rounds == ["job_end"]
    html = response.content.decode()
    assert f"Job {job.pk} cancelled." in html
    assert 'id="cancel-job"' not in html  # nothing left to cancel
    again = client.post(f"/jobs/{job.pk}/cancel/", follow=True).content.decode()
    assert "already CANCELLED" in again


def test_the_cancel_form_carries_a_csrf_token(user, cluster):
    from django.test import Client

    job = pending_job(user)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'name="csrfmiddlewaretoken"' in html
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403  # no token: refused


def test_a_pending_job_shows_its_reason_position_and_estimated_start(user, client_of, cluster):
    job = pending_job(user)
    job_forecasts_refresh()
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>Priority</code>" in html
    assert "<dt>Queue position</dt><dd>1</dd>" in html
    assert '<dt>Estimated start</dt><dd id="estimated-start"><time' in html
    assert '<dt>Estimated finish</dt><dd id="estimated-finish"><time' in html


def test_a_stored_admission_prediction_is_shown(user, client_of, cluster):
    job = pending_job(user, qos_max_latency_s=3600)
    start = timezone.now() + timezone.timedelta(minutes=5)
    AdmissionPrediction.objects.create(
        job=job,
        policy="fifo",
        allocator="tune",
        predicted_start_at=start,
        predicted_finish_at=start + timezone.timedelta(hours=2),
        deadline_at=job.submitted_at + timezone.timedelta(hours=1),
        attainable=False,
    )
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert f'<dd id="predicted-at-submission">start <time datetime="{start:%Y-%m-%dT%H:%M:%S}' in html
    assert f', finish <time datetime="{start + timezone.timedelta(hours=2):%Y-%m-%dT%H:%M:%S}' in html
    assert '<dd id="qos-attainable"><span class="warn">at risk' in html
    assert "<dt>Estimated start</dt>" in html  # the current estimate, beside what was predicted


def test_without_a_prediction_the_helper_gives_none(user, cluster):
    job = pending_job(user)
    assert views._admission_prediction(job) is None


def test_timeline_leases_speeds_and_log_tail(user, client_of, cluster):
    job, allocation = running_job(user, cluster, gpus=2, done_iters=100)
    # A history as the lifecycle writes it (the job's row is already RUNNING).
    job_events_record(
        [
            transition_event(job, NEW, JobState.PENDING),
            transition_event(job, JobState.PENDING, JobState.RUNNING, reason="placed"),
        ]
    )
    allocation.iters_per_s = 3.0
    allocation.speedup = 1.5
    allocation.log_tail = "epoch 1\nepoch 2 loss=0.5"
    allocation.save()
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert html.index("<strong>submitted</strong>") < html.index("<strong>scheduled</strong>")
    assert "PENDING → RUNNING" in html and "<code>placed</code>" in html
    assert "<strong>gpu01</strong> GPU 0,1 · 6 cores · 125 GB" in html
    predicted = 1.5 / job.workload.iter_time_s
    assert f"<td>{predicted:.3f}</td>" in html and "<td>3.000</td>" in html
    assert f"<td>{3.0 / predicted:.2f}</td>" in html
    assert "epoch 1\nepoch 2 loss=0.5" in html


def test_a_speed_observation_wins_over_the_raw_measure(user, client_of, cluster):
    job, allocation = running_job(user, cluster)
    allocation.iters_per_s = 99.0
    allocation.save()
    now = timezone.now()
    SpeedObservation.objects.create(
        workload=job.workload,
        job=job,
        allocation=allocation,
        cpus_per_gpu=3,
        mem_gb_per_gpu=62.5,
        predicted_iters_per_s=2.0,
        measured_iters_per_s=1.0,
        first_at=now,
        at=now,
    )
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert "<td>2.000</td>" in html and "<td>1.000</td>" in html and "<td>0.50</td>" in html
    assert "99.000" not in html


def test_the_job_page_costs_a_bounded_number_of_queries(
    user, client_of, cluster, django_assert_max_num_queries
):
    job, _ = running_job(user, cluster, gpus=2)
    for i in range(30):
        job_event_append(job=job, kind=f"e{i}")
    client = client_of(user)
    client.get(f"/jobs/{job.pk}/")
    # session, user, job, leases, GPU holds, events, speed observations, log tail, admission prediction,
    # the last finished forecast refresh (as of when the estimate holds)
    with django_assert_max_num_queries(11):
        client.get(f"/jobs/{job.pk}/")


def test_the_workloads_learnt_speed_correction_is_shown(user, client_of, cluster):
    job, _ = running_job(user, cluster)
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="speed-correction"' not in html  # nothing learnt yet
    Workload.objects.filter(pk=job.workload_id).update(speed_correction=0.82, speed_correction_jobs=2)
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert "speed correction of\n  0.82" in html and "2 finished jobs" in html


def test_the_workloads_learnt_placement_penalty_is_shown(user, client_of, cluster):
    job, _ = running_job(user, cluster)
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="placement-penalty"' not in html  # the shipped penalty: nothing learnt
    Workload.objects.filter(pk=job.workload_id).update(placement_penalty=1.37, placement_penalty_leases=9)
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert "runs\n  1.37x slower" in html and "9 leases on one" in html


def test_a_pending_job_is_held_and_released_from_its_page(
    user, staff_user, client_of, cluster, no_rounds, django_capture_on_commit_callbacks
):
    job = pending_job(user)
    client = client_of(user)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="hold-job"' in html and 'id="release-job"' not in html
    response = client.post(f"/jobs/{job.pk}/hold/", follow=True)
    html = response.content.decode()
    assert f"Job {job.pk} held." in html and "JobHeldUser" in html
    assert 'id="release-job"' in html and 'id="hold-job"' not in html
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/jobs/{job.pk}/release/")
    job.refresh_from_db()
    assert not job.held and no_rounds == ["release"]  # released: an early round is asked for
    # An administrator's hold: the owner sees no Release button, and a forged POST is refused.
    client_of(staff_user).post(f"/jobs/{job.pk}/hold/")
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "JobHeldAdmin" in html and 'id="release-job"' not in html
    html = client.post(f"/jobs/{job.pk}/release/", follow=True).content.decode()
    assert "only staff can release it" in html
    job.refresh_from_db()
    assert job.held
    assert client_of(UserFactory()).post(f"/jobs/{job.pk}/hold/").status_code == 403


def test_a_finished_job_shows_how_far_it_was_from_its_prediction(user, client_of, cluster):
    submitted = timezone.now() - timezone.timedelta(hours=3)
    job = pending_job(
        user,
        state=JobState.COMPLETED,
        started_at=submitted + timezone.timedelta(minutes=42),
        finished_at=submitted + timezone.timedelta(hours=2, minutes=30),
    )
    AdmissionPrediction.objects.create(
        job=job,
        policy="fifo",
        allocator="tune",
        predicted_start_at=submitted + timezone.timedelta(minutes=30),
        predicted_finish_at=submitted + timezone.timedelta(hours=3),
    )
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert '<small class="muted" id="start-error">(actual start: 12 min later)</small>' in html
    assert '<small class="muted" id="finish-error">(actual finish: 30 min earlier)</small>' in html
    assert 'id="estimated-finish"' not in html  # a finished job has no current estimate


def test_its_owner_lowers_the_time_limit_on_the_page_and_is_told_why_a_raise_is_refused(
    user, client_of, cluster
):
    job = pending_job(user)
    Job.objects.filter(pk=job.pk).update(time_limit_s=7200)
    client = client_of(user)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="update-job"' in html and 'name="array_task_limit"' not in html  # not an array's task
    html = client.post(f"/jobs/{job.pk}/update/", {"time_limit": "90m"}, follow=True).content.decode()
    assert f"Job {job.pk} updated." in html and '<dd id="time-limit">1.5 h</dd>' in html
    html = client.post(f"/jobs/{job.pk}/update/", {"time_limit": "3h"}, follow=True).content.decode()
    assert "only staff can raise a time limit (5400 s now); you may lower it" in html
    html = client.post(f"/jobs/{job.pk}/update/", {"time_limit": "soon"}, follow=True).content.decode()
    assert "The time limit" in html and Job.objects.get(pk=job.pk).time_limit_s == 5400
    assert client_of(UserFactory()).post(f"/jobs/{job.pk}/update/", {"time_limit": "1"}).status_code == 403


def test_the_time_limit_of_every_live_task_of_an_array_changes_at_once(user, client_of, cluster):
    tasks = pending_array(user, [0, 1, 2, 3])
    Job.objects.filter(pk__in=[t.pk for t in tasks[:2]]).update(time_limit_s=7200)  # 2 and 3: none
    Job.objects.filter(pk=tasks[3].pk).update(state=JobState.COMPLETED)
    client = client_of(user)
    page = f"/jobs/{tasks[1].pk}/"
    assert 'id="every-task"' in client.get(page).content.decode()
    every_task = {"every_task": "1"}
    html = client.post(f"{page}update/", {"time_limit": "1h", **every_task}, follow=True).content.decode()
    assert f"3 tasks of array {tasks[0].pk} updated." in html
    limits = Job.objects.filter(array_job_id=tasks[0].pk).order_by("array_task_id")
    assert [job.time_limit_s for job in limits] == [3600, 3600, 3600, None]  # an ended task is left
    # A raise is refused on each task, and each says so.
    html = client.post(f"{page}update/", {"time_limit": "2h", **every_task}, follow=True).content.decode()
    assert all(f"Job {t.pk}: only staff can raise a time limit" in html for t in tasks[:3])
    assert "updated." not in html
    stranger = client_of(UserFactory())
    assert stranger.post(f"{page}update/", {"time_limit": "1", "every_task": "1"}).status_code == 403
    single = pending_job(user)
    html = client.post(f"/jobs/{single.pk}/update/", {"time_limit": "1h", "every_task": "1"}, follow=True)
    assert f"Job {single.pk} is not a task of an array." in html.content.decode()
