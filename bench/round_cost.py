"""What one live round costs at the fleet's shape under churn: its CPU, PostgreSQL's, its statements.

Run: `python -m bench.round_cost [--servers 1000] [--ends 40] [--rounds 4] [--profile] [--db NAME]`
(`--rounds 4` measures 4 rounds with the collector held off, as the service runs them, alternated with
4 with it on, services/gc_pause.py).
Creates a fresh PostgreSQL database with `--servers` IDLE servers of 8 GPUs and the jobs of
bench.agent_fleet's shape (6 per server, 1/1/2/4/1/2 GPUs: the first four fill a server, the rest
queue; catalog workloads), runs the round that places them, then `--rounds` times: `--ends` running
jobs complete (job_finish, as their exits do; at bench.agent_fleet --stress a round follows about 40
job ends at 1,000 servers) and one round (scheduling_round_run, as the rounds' worker runs it, without
the forecast refresh it asks for and without its pace), this process's start-up objects frozen as the
worker's are (config/gc_freeze.py). Printed per round: wall ms, this process's CPU ms
(time.process_time), PostgreSQL's CPU ms (its backend process, psutil: PostgreSQL must run on this
machine), the garbage collector's passes and their ms, statements, jobs placed and runnable; the
baselines in the same run: the pure core (engine.schedule_round) on the round's own inputs, CPU ms, and
the same round with the collector on. With `--profile`, cProfile of the measured
rounds (cumulative and own time) and each round's costliest statements. The database is dropped at
the end, also on error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import sys
import time
from unittest import mock

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logger, logging_setup, servers_create

JOB_GPUS = (1, 1, 2, 4, 1, 2)  # bench.agent_fleet's: per server, the first four fill its 8 GPUs
ITERS = (600, 3000)  # 1 to 5 minutes at the fleet's 10 iterations a second (its --stress)


def populate(num_servers: int, seed: int) -> None:
    from django.contrib.auth import get_user_model

    from profiles_app.models import Workload
    from profiles_app.services.workloads import workload_catalog_load
    from scheduler_app.services.jobs import JobRequest, job_submit

    start = time.perf_counter()
    servers_create(num_servers, uuid_tag="cost")
    workload_catalog_load()
    workloads = list(Workload.objects.order_by("name"))
    owner = get_user_model().objects.create_user("bench", password=None)
    rng = random.Random(seed)
    n = 0
    for _ in range(num_servers):
        for gpus in JOB_GPUS:
            # Admission off: the bench runs the rounds itself.
            job_submit(
                admission=False,
                owner=owner,
                request=JobRequest(
                    name=f"cost-{n}",
                    num_gpus=gpus,
                    total_iters=rng.randint(*ITERS),
                    workload=workloads[n % len(workloads)],
                ),
            )
            n += 1
    logger.info("%d servers, %d jobs submitted in %.1f s", num_servers, n, time.perf_counter() - start)


def jobs_end(count: int, rng: random.Random) -> None:
    """`count` running jobs complete, all their work done (the early rounds they ask for are not run)."""
    from django.db import transaction

    from scheduler_app.models import Job, JobState
    from scheduler_app.services.job_control import job_finish

    running = list(Job.objects.filter(state=JobState.RUNNING).values_list("id", flat=True))
    chosen = sorted(rng.sample(running, min(count, len(running))))
    with (
        mock.patch("scheduler_app.services.round_requests.scheduling_round_request"),
        transaction.atomic(),
    ):
        for job in Job.objects.select_for_update(of=("self",)).filter(pk__in=chosen).order_by("id"):
            job.done_iters = job.total_iters
            job_finish(job=job, state=JobState.COMPLETED, exit_code=0, reason="bench")


def core_cpu_ms() -> float:
    """The pure core on the inputs the round's selectors build now, with the round's restart costs (its
    move guard): CPU ms of engine.schedule_round."""

    from django.db import transaction
    from django.utils import timezone

    from cluster_app.models import Server
    from scheduler_app.conf import scheduler_conf
    from scheduler_app.core.engine import schedule_round
    from scheduler_app.selectors import round_inputs, round_jobs_read
    from scheduler_app.services.live_queue import live_restarts

    conf = scheduler_conf()
    with transaction.atomic():
        servers = list(Server.objects.order_by("id"))
        inputs = round_inputs(servers=servers, jobs=round_jobs_read())
    restarts = live_restarts(servers)  # as services/rounds.py gives them
    now_s = timezone.now().timestamp()
    start = time.process_time()
    schedule_round(
        inputs.snapshot,
        inputs.views,
        policy=conf.policy_obj(),
        allocator=conf.allocator,
        now_s=now_s,
        restarts=restarts,
    )
    return (time.process_time() - start) * 1000


class CollectorPasses:
    """The garbage collector's passes (count, of them full, wall ms) while `counting`."""

    def __init__(self) -> None:
        self.passes, self.full, self.seconds = 0, 0, 0.0
        self._began = 0.0
        self.counting = False
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if not self.counting:
            return
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.passes += 1
        self.full += info["generation"] == 2
        self.seconds += time.perf_counter() - self._began

    def summary(self) -> str:
        return f"{self.passes} ({self.full} full), {self.seconds * 1000:.0f} ms"

    def reset(self) -> None:
        self.passes, self.full, self.seconds = 0, 0, 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--ends", type=int, default=40, help="jobs that end before each measured round")
    parser.add_argument(
        "--rounds", type=int, default=4, help="measured rounds of each kind (collector held off, on)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the measured rounds (those as the service runs them)"
    )
    parser.add_argument(
        "--db", default="attune_bench_round_cost", help="the bench's database (created afresh)"
    )
    args = parser.parse_args(argv)
    logging_setup()
    with bench_database(args.db) as url:
        django_setup(url, ATTUNE_INLINE_ROUNDS="0")
        import cProfile
        import pstats

        import psutil
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        from config.gc_freeze import startup_objects_freeze
        from scheduler_app.services import rounds
        from scheduler_app.services.rounds import scheduling_round_run

        populate(args.servers, args.seed)
        startup_objects_freeze()  # as the worker's process does at its start (config/celery.py)
        passes = CollectorPasses()
        rng = random.Random(args.seed)
        rows = []
        profiler = cProfile.Profile() if args.profile else None
        with (
            mock.patch("scheduler_app.services.rounds.job_forecasts_refresh_request_on_commit"),
            mock.patch("scheduler_app.services.rounds.scheduling_round_pace"),
        ):
            scheduling_round_run(trigger="bench")  # places the first four jobs of every server
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                backend = psutil.Process(cursor.fetchone()[0])
            for number in range(1, 2 * args.rounds + 1):
                collector_on = number % 2 == 0  # the baseline: the round as it ran before gc_paused
                jobs_end(args.ends, rng)
                core_ms = core_cpu_ms()
                db_before = sum(backend.cpu_times()[:2])
                passes.reset()
                paused = mock.patch.object(rounds, "gc_paused", contextlib.nullcontext)
                paused = paused if collector_on else contextlib.nullcontext()
                cpu_before, wall_before = time.process_time(), time.perf_counter()
                with (
                    CaptureQueriesContext(connection) as queries,
                    paused if collector_on else contextlib.nullcontext(),
                ):
                    passes.counting = True
                    if profiler is not None and not collector_on:
                        profiler.enable()
                    sround = scheduling_round_run(trigger="bench")
                    if profiler is not None:
                        profiler.disable()
                    passes.counting = False
                wall_ms = (time.perf_counter() - wall_before) * 1000
                cpu_ms = (time.process_time() - cpu_before) * 1000
                db_ms = (sum(backend.cpu_times()[:2]) - db_before) * 1000
                rows.append(
                    [
                        number, "on" if collector_on else "held off", f"{wall_ms:.0f}", f"{cpu_ms:.0f}",
                        f"{db_ms:.0f}", passes.summary(),
                        f"{core_ms:.0f}", f"{cpu_ms / core_ms:.2f}x", len(queries), sround.num_placed,
                        sround.num_runnable,
                    ]
                )  # fmt: skip
                if args.profile and not collector_on:
                    costly = sorted(queries.captured_queries, key=lambda q: -float(q["time"]))[:5]
                    print(f"round {number}, its costliest statements (wall ms, as the client waited):")
                    for query in costly:
                        print(f"  {float(query['time']) * 1000:7.1f}  {query['sql'][:140]}")
        print_table(
            ["round", "collector", "wall ms", "cpu ms", "postgres cpu ms", "collector passes",
             "core alone cpu ms", "x core", "statements", "placed or kept", "runnable"],
            rows,
        )  # fmt: skip
        if profiler is not None:
            stats = pstats.Stats(profiler).strip_dirs()
            stats.sort_stats("cumulative").print_stats(50)
            stats.sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
