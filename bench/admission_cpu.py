"""A submission's admission CPU on a short queue, with a forecasts worker and without, under the settings.

Run: `[ATTUNE_POLICY=fifo ATTUNE_ALLOCATOR=tune] python -m bench.admission_cpu [--jobs 45] [--servers 4]
[--repeats 5]`. bench.admission's queue (its `populate`, one live round), then, `--repeats` times, a job
submitted through `job_submit`, rolled back, two ways: with a forecasts worker (the default: the request
stores the prediction pending and the worker's coalesced forecast, `admission_forecasts_run`, fills it,
timed apart in the same transaction) and with the forecast in the request (no worker: the embedded demo;
before admission_in_request_max_jobs became 0, also any queue of at most 50 live jobs with a worker).
Each for a QoS job (bench.admission's, 1 GPU, a 6 h latency target) and a job without a QoS target.
Prints the median CPU time (`time.process_time`: the machine is shared, wall time says little) of the
request and of the worker's forecast, the request's CPU with a worker against the in-request one, how
many rounds the forecast decided (schedule_round calls) and whether it predicted the job's finish.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from unittest import mock

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logging_setup
from bench.live_round import populate


class Rollback(Exception):
    """Raised to undo one timed submission."""


def timed(qos: bool, worker: bool) -> tuple[float, float, int, bool]:
    """One submission rolled back: the request's CPU seconds, the worker's forecast's (0 without a
    worker), the rounds the forecast decided, and whether it predicted the finish."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from profiles_app.models import Workload
    from scheduler_app.services.admission_worker import admission_forecasts_run
    from scheduler_app.services.jobs import JobRequest, job_submit
    from scheduler_app.simulator import forecast as forecast_module

    owner = get_user_model().objects.get(username="bench")
    request = JobRequest(
        name="bench-qos" if qos else "bench-plain",
        num_gpus=1,
        total_iters=20_000,
        workload=Workload.objects.get(name="res18"),
        qos_max_latency_s=timedelta(hours=6).total_seconds() if qos else None,
    )
    saved = settings.ATTUNE_SCHEDULER
    settings.ATTUNE_SCHEDULER = {**saved, "inline_rounds": not worker, "admission_in_request_max_jobs": 0}
    decided = [0]
    real = forecast_module.schedule_round

    def counted(*args, **kwargs):
        decided[0] += 1
        return real(*args, **kwargs)

    finished = False
    cpu = worker_cpu = 0.0
    try:
        with (
            transaction.atomic(),
            mock.patch("scheduler_app.services.round_requests.scheduling_round_request"),
            mock.patch("scheduler_app.services.admission_worker.task_send"),
            mock.patch.object(forecast_module, "schedule_round", counted),
        ):
            start = time.process_time()
            (job,) = job_submit(owner=owner, request=request, admission=True)
            cpu = time.process_time() - start
            if worker:
                start = time.process_time()
                admission_forecasts_run()  # in this transaction: it sees the job before the rollback
                worker_cpu = time.process_time() - start
            job.admission_prediction.refresh_from_db()
            finished = job.admission_prediction.predicted_finish_at is not None
            raise Rollback
    except Rollback:
        pass
    finally:
        settings.ATTUNE_SCHEDULER = saved
    return cpu, worker_cpu, decided[0], finished


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=45, help="jobs in the queue before the timed one")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", default="attune_bench_admission_cpu", help="database to create and drop")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    args = parser.parse_args()
    logging_setup()
    rows = []
    with bench_database(args.db) as url:
        django_setup(url, REDIS_URL=args.redis_url)
        from scheduler_app.conf import scheduler_conf
        from scheduler_app.models import Job, JobState
        from scheduler_app.services.rounds import scheduling_round_run

        populate(args.servers, args.jobs, args.seed)
        scheduling_round_run(trigger="bench")
        running = Job.objects.filter(state=JobState.RUNNING).count()
        conf = scheduler_conf()
        for qos in (True, False):
            # Alternated, so that both ways see the same minutes of a shared machine.
            runs = {True: [], False: []}
            for _ in range(args.repeats):
                for worker in (False, True):
                    runs[worker].append(timed(qos, worker))
            inline_ms = 1000 * statistics.median(r[0] for r in runs[False])
            for worker in (True, False):
                request_ms = 1000 * statistics.median(r[0] for r in runs[worker])
                rows.append(
                    [
                        "QoS job (6 h latency)" if qos else "job without a QoS target",
                        "with a forecasts worker (default)" if worker else "in the request (no worker)",
                        f"{request_ms:.0f}",
                        f"{request_ms / inline_ms:.3f}",
                        f"{1000 * statistics.median(r[1] for r in runs[worker]):.0f}" if worker else "-",
                        f"{statistics.median(r[2] for r in runs[worker]):.0f}",
                        "yes" if all(r[3] for r in runs[worker]) else "no",
                    ]
                )
    print(
        f"\n{conf.policy} + {conf.allocator}, {args.jobs} jobs queued ({running} running) on {args.servers} "
        f"servers x 8 GPUs, rounds of {conf.round_s:g} s, median of {args.repeats}\n"
    )
    print_table(
        [
            "submission",
            "forecast",
            "request CPU ms",
            "x in-request",
            "worker CPU ms",
            "rounds decided",
            "finish predicted",
        ],
        rows,
    )
    print(f"budgets: request {conf.forecast_time_budget_s:g} s, worker {conf.forecast_refresh_budget_s:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
