"""Submission with admission feedback (forecast of the queue) against a plain submission, on PostgreSQL.

Run: `python -m bench.admission [--servers 16] [--jobs 1000] [--repeats 5]`. A fresh database with
`--servers` x 8 GPUs, `--jobs` catalog jobs submitted and one live round run (so the forecast starts
from running jobs and a queue). Then, `--repeats` times, the same QoS job is submitted through
`job_submit`: as the baseline with `admission=False`; with a forecasts worker (what the API and the
web form do past a short queue: the prediction stored pending, then the worker's coalesced forecast
of it, `admission_forecasts_run`, timed apart); and with the forecast in the request (no worker: the
embedded demo). Each submission is rolled back so every repeat sees the same queue. Prints the
medians, the ratios to the baseline, and whether the forecast predicted the job's finish.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from typing import Any
from unittest import mock

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logging_setup
from bench.live_round import populate


class Rollback(Exception):
    """Raised to undo one timed submission."""


def timed_submission(mode: str) -> tuple[float, float, Any]:
    """One submission rolled back: `mode` "plain" (admission off), "worker" (the request's part with a
    forecasts worker, then the worker's forecast) or "request" (the forecast in the request). Returns
    the request's seconds, the worker's seconds (0 but for "worker") and the prediction."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from profiles_app.models import Workload
    from scheduler_app.services.admission_worker import admission_forecasts_run
    from scheduler_app.services.jobs import JobRequest, job_submit

    owner = get_user_model().objects.get(username="bench")
    request = JobRequest(
        name="bench-qos",
        num_gpus=1,
        total_iters=20_000,
        workload=Workload.objects.get(name="res18"),
        qos_max_latency_s=timedelta(hours=6).total_seconds(),
    )
    saved = settings.ATTUNE_SCHEDULER
    settings.ATTUNE_SCHEDULER = {
        **saved,
        "inline_rounds": mode != "worker",
        "admission_in_request_max_jobs": 0,
    }
    prediction, worker_s = None, 0.0
    start = time.perf_counter()
    try:
        with (
            transaction.atomic(),
            mock.patch("scheduler_app.services.round_requests.scheduling_round_request"),
            mock.patch("scheduler_app.services.admission_worker.task_send"),
        ):
            (job,) = job_submit(owner=owner, request=request, admission=mode != "plain")
            elapsed = time.perf_counter() - start
            if mode == "worker":
                worker_start = time.perf_counter()
                admission_forecasts_run()  # in this transaction: it sees the job before the rollback
                worker_s = time.perf_counter() - worker_start
            if mode != "plain":
                job.admission_prediction.refresh_from_db()
                prediction = job.admission_prediction
            raise Rollback
    except Rollback:
        pass
    finally:
        settings.ATTUNE_SCHEDULER = saved
    return elapsed, worker_s, prediction


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in the queue before the timed one")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", default="attune_bench_admission", help="database to create and drop")
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/13", help="the worker's forecast paces itself there"
    )
    args = parser.parse_args()
    logging_setup()
    with bench_database(args.db) as url:
        django_setup(url, REDIS_URL=args.redis_url)
        from scheduler_app.conf import scheduler_conf
        from scheduler_app.models import Job, JobState
        from scheduler_app.services.rounds import scheduling_round_run

        populate(args.servers, args.jobs, args.seed)
        scheduling_round_run(trigger="bench")
        running = Job.objects.filter(state=JobState.RUNNING).count()
        plain = [timed_submission("plain")[0] for _ in range(args.repeats)]
        worker = [timed_submission("worker") for _ in range(args.repeats)]
        inline = [timed_submission("request") for _ in range(args.repeats)]
        conf = scheduler_conf()
    base_ms = 1000 * statistics.median(plain)

    def row(label: str, runs: list) -> list:
        request_ms = 1000 * statistics.median(s for s, _, _ in runs)
        worker_ms = 1000 * statistics.median(w for _, w, _ in runs)
        prediction = runs[-1][2]
        return [
            label,
            f"{request_ms:.0f}",
            f"{request_ms / base_ms:.1f}x",
            f"{worker_ms:.0f}" if worker_ms else "-",
            "yes" if prediction.predicted_finish_at is not None else f"no ({prediction.detail[:60]})",
        ]

    print(
        f"\n{args.jobs} jobs queued ({running} running) on {args.servers} servers x 8 GPUs, "
        f"median of {args.repeats}\n"
    )
    print_table(
        ["submission", "request ms", "x plain", "worker's forecast ms", "finish predicted"],
        [
            ["plain (admission off: the baseline)", f"{base_ms:.0f}", "1.0x", "-", "-"],
            row("with a forecasts worker (the API past a short queue)", worker),
            row("forecast in the request (no worker)", inline),
        ],
    )
    print(f"budgets: request {conf.forecast_time_budget_s:g} s, worker {conf.forecast_refresh_budget_s:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
