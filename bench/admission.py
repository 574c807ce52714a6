"""Submission with admission feedback (forecast of the queue) against a plain submission, on PostgreSQL.

Run: `python -m bench.admission [--servers 16] [--jobs 1000] [--repeats 5]`. A fresh database with
`--servers` x 8 GPUs, `--jobs` catalog jobs submitted and one live round run (so the forecast starts
from running jobs and a queue). Then, `--repeats` times, the same QoS job
is submitted through `job_submit` (submit + forecast + stored prediction, what the API and the web
form do) and, as the baseline in the same run, with `admission=False`; each submission is rolled
back so every repeat sees the same queue. Prints both medians, their ratio, and whether the forecast
finished inside its time budget (`ATTUNE_FORECAST_TIME_BUDGET_S`).
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


def timed_submission(enqueue: bool) -> tuple[float, Any]:
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from profiles_app.models import Workload
    from scheduler_app.services.jobs import JobRequest, job_submit

    owner = get_user_model().objects.get(username="bench")
    request = JobRequest(
        name="bench-qos",
        num_gpus=1,
        total_iters=20_000,
        workload=Workload.objects.get(name="res18"),
        qos_max_latency_s=timedelta(hours=6).total_seconds(),
    )
    prediction = None
    start = time.perf_counter()
    try:
        with (
            transaction.atomic(),
            mock.patch("scheduler_app.services.round_requests.scheduling_round_request"),
        ):
            # The baseline turns admission off: the submission alone, without its forecast.
            (job,) = job_submit(owner=owner, request=request, admission=enqueue)
            if enqueue:
                prediction = job.admission_prediction
            elapsed = time.perf_counter() - start
            raise Rollback
    except Rollback:
        pass
    return elapsed, prediction


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in the queue before the timed one")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", default="attune_bench_admission", help="database to create and drop")
    args = parser.parse_args()
    logging_setup()
    with bench_database(args.db) as url:
        django_setup(url)
        from scheduler_app.conf import scheduler_conf
        from scheduler_app.models import Job, JobState
        from scheduler_app.services.rounds import scheduling_round_run

        populate(args.servers, args.jobs, args.seed)
        scheduling_round_run(trigger="bench")
        running = Job.objects.filter(state=JobState.RUNNING).count()
        plain = [timed_submission(False)[0] for _ in range(args.repeats)]
        runs = [timed_submission(True) for _ in range(args.repeats)]
        conf = scheduler_conf()
    forecast_s = statistics.median(s for s, _ in runs)
    prediction = runs[-1][1]
    rows = [
        [
            f"{args.jobs} ({running} running)",
            f"{1000 * statistics.median(plain):.0f}",
            f"{1000 * forecast_s:.0f}",
            f"{forecast_s / statistics.median(plain):.1f}x",
            "yes" if prediction.predicted_finish_at is not None else f"no ({prediction.detail})",
            f"{conf.forecast_time_budget_s:g}",
        ]
    ]
    print(f"\n{args.servers} servers x 8 GPUs, median of {args.repeats} submissions each\n")
    print_table(["queue", "submit ms", "submit + forecast ms", "ratio", "finish predicted", "budget s"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
