"""`submit --wait` with a deep queue: the admission forecast follows the answer, and the command line
prints it once the service has it, before the job's changes."""

from __future__ import annotations

import re
import threading
import time

from django.db import connection

from scheduler_app.models import AdmissionPrediction, Job
from scheduler_app.services import admission_worker
from scheduler_app.services.admission_worker import FORECAST_PENDING, admission_forecasts_run
from scheduler_app.services.job_control import job_cancel
from tests.cli.helpers import run


def test_submit_wait_prints_the_forecast_when_the_worker_has_it(
    service, capsys, settings, live_redis, monkeypatch
):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "inline_rounds": False,
        "admission_in_request_max_jobs": 0,  # the forecasts worker's, as with a deep queue
        "admission_answer_wait_s": 0.0,  # and not in the answer
    }
    keys = (admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)
    live_redis.delete(*keys)

    def worker_later(name: str, **kwargs) -> None:
        def forecast() -> None:
            time.sleep(0.3)
            admission_forecasts_run()
            connection.close()

        threading.Thread(target=forecast).start()

    monkeypatch.setattr(admission_worker, "task_send", worker_later)
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request", lambda *, trigger: None
    )

    def cancel_once_forecast() -> None:
        deadline = time.monotonic() + 30
        forecast = AdmissionPrediction.objects.filter(job__name="later").exclude(detail=FORECAST_PENDING)
        while not forecast.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        job = Job.objects.get(name="later")
        job_cancel(job=job, by=job.owner)
        connection.close()

    run(capsys, "--server", service, "login", "--username", "alice")
    ender = threading.Thread(target=cancel_once_forecast)
    ender.start()
    _, out, _ = run(
        capsys,
        "submit",
        "later",
        "--workload",
        "res18",
        "--gpus",
        "1",
        "--iters",
        "10",
        "--wait",
        "--poll-s",
        "0.05",
    )
    ender.join()
    live_redis.delete(*keys)
    lines = out.splitlines()
    pending = next(i for i, line in enumerate(lines) if FORECAST_PENDING in line)
    answered = next(i for i, line in enumerate(lines) if re.search(r"predicted start \d{4}-", line))
    assert pending < answered, out
    assert AdmissionPrediction.objects.get(job__name="later").predicted_start_at is not None
