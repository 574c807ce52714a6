"""What one agent sync costs the web tier: CPU per call and statements, against /healthz in the same run.

Run: `python -m bench.sync_cost [--syncs 200] [--exits 100] [--db NAME] [--redis-url URL] [--profile
KIND] [--served]`; `--served`: every agent call as the image serves it (config/agent_calls.py's path
first, Django's request signals), not through the test client. Creates a fresh PostgreSQL database with
one server (8 GPUs) running 8 one-GPU jobs placed by a real round, then calls `POST /api/v1/agent/sync`
through Django's full request handler in this process (middleware, authentication, validation, the
service, the answer; no network, so the figure is the web process's own CPU, not the bench's or the
socket's) with a usage sample of 8 GPUs, the 8 running leases and 0, 1 or 8 progress reports, and `GET
/healthz` as the baseline; then the syncs with progress left to the worker's applier
(ATTUNE_PROGRESS_APPLY_S, the default with workers) and the applier's own CPU per report, applying what
they left pending; then a job's end call by call on a second server (JobEnds): the exit's sync, the
woken sync that delivers the next job's `start` and the sync with its `started` report, and the
applier's CPU per job end. `--db` and `--redis-url` keep a run off another's database and Redis. CPU
time (`time.process_time`) is this process only; the database server's share is read from its backend
process (`pg_backend_pid()`: PostgreSQL must run on this machine), its run time in /proc/PID/schedstat
(exact; psutil's user + system time, sampled in ticks, where Linux's is missing), as a mean per call.
Printed per kind: CPU ms p50 / p90, PostgreSQL CPU ms per call, statements per call, and the ratio to
/healthz; with `--profile KIND`, cProfile's view of that kind's calls. CPU time moves much less than
wall time with the machine's load, so the figure holds on a shared machine; the fleet's capacity is
roughly two cores' worth of these, less the agents and the rounds (bench/agent_fleet.py measures that).
"""

from __future__ import annotations

import argparse
import sys

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logger, logging_setup, percentile
from bench.sync_cost_job_end import job_end_rows
from bench.sync_cost_measure import Profile, applier_row, measure
from bench.sync_cost_parts import parts_rows
from bench.sync_cost_setup import Agent, ServedClient, setup

PROFILE_KINDS = ("sync0", "sync4", "exit", "deliver", "started")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--syncs", type=int, default=200, help="measured calls per kind")
    parser.add_argument("--exits", type=int, default=100, help="measured exits (job ends) per kind")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--db", default="attune_bench_sync", help="the bench's database (created afresh)")
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/14",
        help="Redis for the few keys a sync sets (an exit's apply request); nothing is flushed",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILE_KINDS,
        default=None,
        help="cProfile one kind of call (sync0, sync4: a sync with 0 or 4 progress reports left to the"
        " applier; exit, deliver, started: a job's end's calls) and print where its CPU goes (that kind's"
        " figures then carry the profiler's own overhead)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="instead of the kinds: an interval sync with 4 reports part by part, each timed alone, with"
        " the view without the middleware and the whole call (--syncs of each)",
    )
    parser.add_argument(
        "--served",
        action="store_true",
        help="every agent call as the image serves it: a WSGI environ through the agents' path"
        " (config/agent_calls.py) first, with Django's request signals, instead of the test client",
    )
    args = parser.parse_args(argv)
    logging_setup()
    profile = Profile(args.profile)
    with bench_database(args.db, keep=args.keep) as url:
        # Agents' wakes on, as the service runs with workers: a sync reads its server's wake generation
        # and signs a wait ticket, an exit wakes the agents of its job's next leases (Redis).
        django_setup(url, ATTUNE_AGENT_WAKE="1", REDIS_URL=args.redis_url)
        client, leases, gpus = setup()
        if args.served:
            client = ServedClient(client)
        agent = Agent(client, leases, gpus)
        agent.sync(0)  # the leases' `started` reports
        if args.parts:
            from django.conf import settings

            settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False,
                                         "progress_apply_s": 2.0}  # fmt: skip
            print_table(
                ["part of a sync, 4 reports", "cpu ms p50", "postgres cpu ms"], parts_rows(agent, args.syncs)
            )
            return 0
        rows = []
        healthz, healthz_db, healthz_q = measure(lambda: client.get("/healthz"), args.syncs)
        base = percentile(healthz, 50)
        rows.append(["GET /healthz", f"{base:.2f}", f"{percentile(healthz, 90):.2f}", f"{healthz_db:.2f}",
                     healthz_q, "1.0x"])  # fmt: skip
        for reports in (0, 1, 8):
            cpu, db_ms, statements = measure(lambda n=reports: agent.sync(n), args.syncs)
            p50 = percentile(cpu, 50)
            p90 = percentile(cpu, 90)
            rows.append([f"sync, {reports} reports", f"{p50:.2f}", f"{p90:.2f}", f"{db_ms:.2f}", statements,
                         f"{p50 / base:.1f}x"])  # fmt: skip
        # The same syncs with progress left to the worker's applier (the default with workers), then
        # the applier's own cost per report, applying all that these syncs left pending.
        from django.conf import settings

        from scheduler_app.models import AgentReportPending

        deferred = {"inline_rounds": False, "progress_apply_s": 2.0}
        settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, **deferred}
        for reports in (1, 8):
            cpu, db_ms, statements = measure(lambda n=reports: agent.sync(n), args.syncs)
            p50 = percentile(cpu, 50)
            rows.append([f"sync, {reports} reports, applier", f"{p50:.2f}", f"{percentile(cpu, 90):.2f}",
                         f"{db_ms:.2f}", statements, f"{p50 / base:.1f}x"])  # fmt: skip
        rows.append(applier_row(AgentReportPending.objects.count(), base))
        if args.profile in ("sync0", "sync4"):
            reports = 0 if args.profile == "sync0" else 4
            measure(profile.around(args.profile, lambda: agent.sync(reports)), args.syncs)
        rows += job_end_rows(args.exits, base, profile, served=args.served)
        logger.info("%d calls per kind measured", args.syncs)
        print_table(["call", "cpu ms p50", "cpu ms p90", "postgres cpu ms", "statements", "x healthz"], rows)
        profile.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
