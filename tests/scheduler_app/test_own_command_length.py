"""How long an own command (no profile) is taken to run: measured speed, else its time limit.

Rounds, the queue's estimated start and admission forecasts all take it from
selectors.own_command_iter_time_s, so a job queued behind an own command is told when it frees its GPUs.
"""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler_app.models import Allocation, Job, JobState
from scheduler_app.selectors import (
    OWN_COMMAND_GUESS_ITER_S,
    job_queue,
    own_command_iter_time_s,
    round_inputs,
)
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import lease_of, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

JOBS = "/api/v1/jobs/"


def own_command(user, *, gpus: int = 4, iters: int = 100, time_limit_s: int | None = None) -> Job:
    return submit(user, gpus=gpus, iters=iters, command="python train.py", time_limit_s=time_limit_s)


def started(job: Job) -> Job:
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_measured_speed_wins_then_the_time_limit_then_nothing(user):
    limited = Job(total_iters=1000, time_limit_s=3600)
    assert own_command_iter_time_s(limited, [None, 4.0, 2.0]) == pytest.approx(0.25)
    assert own_command_iter_time_s(limited, [None, 0.0]) == pytest.approx(3.6)
    assert own_command_iter_time_s(Job(total_iters=1000), []) is None


def test_the_round_sees_an_own_commands_time_limit_or_the_guess(user, gpu01_res18):
    limited = own_command(user, gpus=1, iters=1000, time_limit_s=3600)
    unlimited = own_command(user, gpus=1, iters=1000)
    inputs = round_inputs(servers=[gpu01_res18], jobs=[limited, unlimited])
    iter_s = {v.job_id: v.profile.iter_time_s for v in inputs.views}
    assert iter_s == {limited.pk: pytest.approx(3.6), unlimited.pk: OWN_COMMAND_GUESS_ITER_S}


def test_the_round_sees_a_running_own_commands_measured_speed(user, gpu01_res18):
    job = started(own_command(user, gpus=1, iters=1000, time_limit_s=3600))
    Allocation.objects.filter(pk=lease_of(job).pk).update(iters_per_s=5.0)
    (view,) = round_inputs(servers=[gpu01_res18], jobs=[job]).views
    assert view.profile.iter_time_s == pytest.approx(0.2)


def test_a_job_behind_an_own_command_is_forecast_to_start_when_its_time_limit_ends(user, gpu01_res18):
    blocker = started(own_command(user, gpus=4, iters=10, time_limit_s=2 * 3600))
    api = APIClient()
    api.force_authenticate(user)
    body = api.post(
        JOBS, {"name": "next", "workload": "res18", "num_gpus": 1, "total_iters": 100}, format="json"
    )
    assert body.status_code == 201, body.json()
    start = at(body.json()["admission"]["predicted_start_at"])
    # Its 10 iterations are spread over its 2-hour limit (a guessed 1 s each would free it in seconds).
    assert (
        blocker.started_at + timedelta(hours=2) <= start <= blocker.started_at + timedelta(hours=2, minutes=2)
    )


def test_a_job_behind_an_own_command_that_reports_its_speed_starts_when_it_will_finish(user, gpu01_res18):
    blocker = started(own_command(user, gpus=4, iters=1000))
    Allocation.objects.filter(pk=lease_of(blocker).pk).update(iters_per_s=0.5)  # 2000 s left
    Job.objects.filter(pk=blocker.pk).update(done_iters=0)
    pending = submit(user, gpus=1, iters=100)
    now = timezone.now()
    job_forecasts_refresh(now=now)
    (entry,) = job_queue().values()
    assert entry.estimated_start_at is not None
    assert now + timedelta(seconds=2000) <= entry.estimated_start_at <= now + timedelta(seconds=2000 + 120)
    # Without a measure or a time limit nobody can say when it frees its GPUs.
    Allocation.objects.filter(pk=lease_of(blocker).pk).update(iters_per_s=None)
    job_forecasts_refresh(now=now)
    assert job_queue()[pending.pk].estimated_start_at is None
