"""The forecasts worker's admission forecast against a deep queue, in-process: where its time goes.

Run: `python -m bench.admission_deep [--servers 500] [--queued 10000] [--submissions 20] [--repeats 3]
[--profile N]`, with ATTUNE_POLICY / ATTUNE_ALLOCATOR in the environment for the pair to measure.

A fresh PostgreSQL database (`--db`, dropped at the end), `--servers` servers of 8 GPUs, the catalog and
`--queued` jobs as arrays of 1,000 (bench.forecast_refresh's queue), one live round, one refresh (the
stored forecast a service has); the service's settings with a worker (ATTUNE_INLINE_ROUNDS=0, nothing
sent to a broker). Then, `--repeats` times: `--submissions` single catalog jobs submitted through
job_submit (each request's CPU and whether it was answered in the request or left to the worker), and
the worker's admission forecast (admission_forecasts_run) that fills them, timed by step (CPU and
wall: the queue's read, the forecast, the positions, the stores); with `--profile N`, cProfile's N
costliest functions of the last one. Also printed: the refresh after the round (CPU and wall, once).
"""

from __future__ import annotations

import argparse
import cProfile
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from contextlib import ExitStack, contextmanager
from unittest import mock

from bench.common import profile_print
from bench.forecast_refresh import GPU_MIX, one_round, populate
from bench.live_common import bench_database, django_setup, logging_setup


@contextmanager
def counted_rounds(played: list[tuple[int, int]], dump: str | None = None):
    """Record each core forecast's rounds: (played, decided by the core), read from its ForecastRun
    once it returns; with `dump`, pickle the first one's inputs (snapshot, views, keyword arguments)
    there, for bench.admission_rounds."""
    import pickle

    import scheduler_app.services.forecasts as forecasts

    real_run = forecasts.ForecastRun

    class CountedRun(real_run):  # type: ignore[misc, valid-type]
        """live_forecast's ForecastRun: its inputs dumped (the first), its rounds counted once read."""

        def __init__(self, snapshot, views, **kwargs):
            if dump and not played:
                with open(dump, "wb") as out:
                    pickle.dump((snapshot, list(views), kwargs), out)
            super().__init__(snapshot, views, **kwargs)

        def play(self, *args, **kwargs):
            try:
                return super().play(*args, **kwargs)
            finally:
                played.append((self.k, self.decided))

    with mock.patch.object(forecasts, "ForecastRun", CountedRun):
        yield


@contextmanager
def timed_steps(totals: dict[str, list[float]]):
    """Time (CPU, wall) the admission forecast's steps, by the functions admission.py calls."""
    import scheduler_app.services.admission as admission
    import scheduler_app.services.forecasts as forecasts
    import scheduler_app.services.live_queue as live_queue

    def wrap(module, name: str, label: str):
        real = getattr(module, name)

        def timed(*args, **kwargs):
            start, start_cpu = time.perf_counter(), time.process_time()
            try:
                return real(*args, **kwargs)
            finally:
                totals[label + " cpu"].append(time.process_time() - start_cpu)
                totals[label + " wall"].append(time.perf_counter() - start)

        return mock.patch.object(module, name, timed)

    names = [
        (admission, "_pending_predictions", "pending read"),
        (admission, "live_queue", "live_queue"),
        (admission, "live_forecast", "live_forecast"),
        (admission, "queue_positions", "queue_positions"),
        (admission, "job_forecasts_store", "forecasts store"),
        (admission, "job_positions_store", "positions store"),
        (admission, "admission_predictions_fill", "predictions fill"),
        (forecasts.ForecastRun, "play", "  core forecast"),
        (forecasts, "_window", "  _window"),
        (live_queue, "live_jobs", "  live_jobs"),
        (live_queue, "round_inputs", "  round_inputs"),
    ]
    with ExitStack() as stack:
        for module, name, label in names:
            if hasattr(module, name):
                stack.enter_context(wrap(module, name, label))
        yield


def submit(count: int, rng: random.Random) -> tuple[list[float], int]:
    """`count` single catalog jobs through job_submit; their CPU seconds and how many were answered in
    the request (not left pending for the worker)."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from profiles_app.models import Workload
    from scheduler_app.models import AdmissionPrediction
    from scheduler_app.services.admission_worker import FORECAST_PENDING
    from scheduler_app.services.jobs import JobRequest, job_submit

    owner = get_user_model().objects.get(username="refresh")
    workloads = list(Workload.objects.order_by("name"))
    cpu, ids = [], []
    for n in range(count):
        request = JobRequest(
            name=f"deep-{n}",
            workload=rng.choice(workloads),
            num_gpus=rng.choice(GPU_MIX),
            total_iters=rng.randint(20_000, 2_000_000),
        )
        start = time.process_time()
        with transaction.atomic():
            ids += [job.pk for job in job_submit(owner=owner, request=request)]
        cpu.append(time.process_time() - start)
    pending = AdmissionPrediction.objects.filter(job_id__in=ids, detail=FORECAST_PENDING).count()
    return cpu, len(ids) - pending


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--submissions", type=int, default=20, help="submitted before each forecast")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's N costliest functions")
    parser.add_argument("--db", default="attune_bench_admission_deep", help="database to create and drop")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="flushed first")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dump", help="pickle the first admission forecast's core inputs to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import redis

    args = arguments(argv)
    logging_setup()
    redis.Redis.from_url(args.redis_url).flushdb()
    env = {
        "ATTUNE_INLINE_ROUNDS": "0",
        "REDIS_URL": args.redis_url,
        "CELERY_BROKER_URL": args.redis_url,
        "CELERY_RESULT_BACKEND": args.redis_url,
        "CACHE_URL": args.redis_url,
    }
    with bench_database(args.db) as url, mock.patch("infra.task_send.task_send"):
        django_setup(url, **env)
        from django.db import connections

        from scheduler_app.conf import scheduler_conf
        from scheduler_app.models import Job, JobState
        from scheduler_app.services.admission_worker import admission_forecasts_run
        from scheduler_app.services.forecasts import job_forecasts_refresh

        conf = scheduler_conf()
        populate(args.servers, args.queued, args.seed)
        one_round()
        with connections["default"].cursor() as cursor:
            cursor.execute("ANALYZE")
        start, start_cpu = time.perf_counter(), time.process_time()
        job_forecasts_refresh()
        refresh = (time.process_time() - start_cpu, time.perf_counter() - start)
        live = Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING]).count()
        rng = random.Random(args.seed)
        request_cpu: list[float] = []
        answered = 0
        runs: list[tuple[float, float, int]] = []
        totals: dict[str, list[float]] = defaultdict(list)
        rounds: list[tuple[int, int]] = []
        profiler = None
        for repeat in range(args.repeats):
            cpu, now_answered = submit(args.submissions, rng)
            request_cpu += cpu
            answered += now_answered
            last = repeat == args.repeats - 1
            profiler = cProfile.Profile(time.process_time) if args.profile and last else None
            with counted_rounds(rounds, args.dump), timed_steps(totals):
                start, start_cpu = time.perf_counter(), time.process_time()
                if profiler:
                    profiler.enable()
                filled = admission_forecasts_run()
                if profiler:
                    profiler.disable()
                runs.append((time.process_time() - start_cpu, time.perf_counter() - start, filled))
        from scheduler_app.models import AdmissionPrediction

        filled = AdmissionPrediction.objects.filter(job__name__startswith="deep-")
        details = [d.split(" (")[0][:60] for d in filled.values_list("detail", flat=True)]
        starts = filled.filter(predicted_start_at__isnull=False).count()
        connections.close_all()
    submitted = args.repeats * args.submissions
    print(
        f"\n{conf.policy} + {conf.allocator}: {live} live jobs on {args.servers} x 8 GPUs; "
        f"{args.submissions} submissions before each of {args.repeats} admission forecasts"
    )
    print(
        f"a submission's request: median {1000 * statistics.median(request_cpu):.1f} ms CPU; "
        f"{answered} of {submitted} answered in the request"
    )
    print(f"answers: {starts} with a predicted start; details {dict(Counter(details))}")
    print(f"the refresh after the round: {refresh[0]:.2f} s CPU, {refresh[1]:.2f} s wall")
    for (cpu_s, wall_s, filled), (played, decided) in zip(runs, rounds, strict=False):
        print(
            f"admission forecast: {cpu_s:.2f} s CPU, {wall_s:.2f} s wall, {filled} filled; "
            f"{played} rounds played, {decided} decided by the core"
        )
    for label in sorted({k.rsplit(" ", 1)[0] for k in totals}, key=lambda k: k.strip()):
        cpu_s, wall_s = totals[label + " cpu"], totals[label + " wall"]
        print(
            f"  {label:<20} calls {len(cpu_s):>3}, CPU per run {sum(cpu_s) / args.repeats:.3f} s, "
            f"wall per run {sum(wall_s) / args.repeats:.3f} s"
        )
    if profiler:
        profile_print(profiler, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
