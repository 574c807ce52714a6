"""Moves per job start and splits of single-server jobs on the live service under the demo's mix, with
restart costs on against off (issue 36).

Run: `python -m bench.live_moves [--minutes 2.5] [--costs both|on|off]`. Each run (with `both`, one with
ATTUNE_RESTART_COSTS=true, then one with false, each in a process of its own) creates a fresh
PostgreSQL database, starts the service as bench.agent_fleet does (gunicorn, a Celery worker with beat
and one of the `forecasts` queue, on Redis database --redis, flushed first) and real agents with fake
GPUs like `make demo`'s (`python -m agent --fake-gpus 8 --fake-cpus 24 --fake-mem-gb 500`, --time-scale
0.05): three servers, a fourth joining halfway. The demo's mix: seed_demo's users, teams and six
jobs, then, as the demo's trickle does, a random catalog job every --submit-every-s while fewer than
--max-pending wait, of 1, 1, 1, 2, 4 or 8 GPUs (the demo's sizes and the issue's 8-GPU res50), each
--job-s long at the fake nodes' speed (the demo's 2 to 10 minutes shortened so that jobs end within
the run). After --minutes it counts from the job history: job starts (PENDING -> RUNNING), moves (a
running job's lease ended and restarted elsewhere, JobEvent reason `moved`), preemptions (back to the
queue), splits (placements of a job that fits on one server and did not ask for several nodes, over
several servers) and the work the restarts lost (Allocation.lost_work_s x GPUs, where the service
records it). The minimum run time is --min-run-s (the bench's jobs are short; the service's default
is 300 s); horizon and margin are the service's defaults unless given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from io import StringIO
from pathlib import Path

import redis

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logger, logging_setup
from bench.live_service import REPO_ROOT, processes, service_env

DEMO_SERVER = {"gpus": 8, "cpus": 24, "mem_gb": 500}
SIZES = (1, 1, 1, 2, 4, 8)  # the demo trickle's GPU counts, and the 8-GPU job of the issue


def agent_start(name: str, url: str, time_scale: float, base: Path) -> subprocess.Popen:
    """A real agent with fake GPUs, as `manage.py demo` starts it (a node token first)."""
    from django.core.management import call_command

    out = StringIO()
    call_command(
        "node_token",
        name,
        "--gpus",
        str(DEMO_SERVER["gpus"]),
        "--cpus",
        str(DEMO_SERVER["cpus"]),
        "--mem-gb",
        str(DEMO_SERVER["mem_gb"]),
        stdout=out,
        stderr=StringIO(),
    )
    home = base / name
    home.mkdir(parents=True)
    home.chmod(0o711)  # jobs run as another account (nobody) when the bench runs as root
    log = (home / "agent.log").open("w")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env["ATTUNE_AGENT_TOKEN"] = out.getvalue().strip()
    return subprocess.Popen(
        [
            sys.executable, "-m", "agent", "--server", url, "--name", name,
            "--fake-gpus", str(DEMO_SERVER["gpus"]), "--fake-cpus", str(DEMO_SERVER["cpus"]),
            "--fake-mem-gb", str(DEMO_SERVER["mem_gb"]), "--time-scale", str(time_scale),
            "--spool-dir", str(home / "spool"), "--work-dir", str(home / "work"),
            "--stop-leases-on-exit", "--address", "127.0.0.1",
        ],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def trickle(stop: threading.Event, args: argparse.Namespace) -> None:
    """The demo's trickle (manage.py demo), faster: a random catalog job now and then, while few wait."""
    from django.contrib.auth import get_user_model
    from django.db import close_old_connections

    from profiles_app.models import Workload
    from scheduler_app.models import Job, JobState, Team
    from scheduler_app.services import JobRequest, job_submit

    rng = random.Random(args.seed)
    while not stop.wait(args.submit_every_s):
        try:
            if Job.objects.filter(state=JobState.PENDING).count() >= args.max_pending:
                continue
            team = rng.choice(list(Team.objects.order_by("name").prefetch_related("members")))
            owner = team.members.first() or get_user_model().objects.get(username="admin")
            workload = rng.choice(list(Workload.objects.exclude(name__in=["bert", "vae"]).order_by("name")))
            job_submit(
                owner=owner,
                request=JobRequest(
                    name=f"{workload.name}-{rng.randrange(100000)}",
                    num_gpus=rng.choice(SIZES),
                    total_iters=int(rng.uniform(*args.job_s) / (workload.iter_time_s * args.time_scale)),
                    workload=workload,
                    team=team,
                ),
            )
        except Exception:
            logger.exception("could not submit a job")
        finally:
            close_old_connections()


def seed_demo_jobs(args: argparse.Namespace) -> None:
    """seed_demo's users, teams, catalog and six jobs, shortened to --job-s like the trickle's."""
    from django.core.management import call_command

    from scheduler_app.models import Job

    call_command("seed_demo", servers=0, verbosity=0)
    rng = random.Random(args.seed + 1)
    for job in Job.objects.select_related("workload"):
        job.total_iters = int(rng.uniform(*args.job_s) / (job.workload.iter_time_s * args.time_scale))
        job.save(update_fields=["total_iters"])


def counts(largest_server_gpus: int) -> dict[str, float]:
    """What the run's history says (module docstring)."""
    from collections import defaultdict

    from django.db.models import F, Sum

    from scheduler_app.models import Allocation, JobEvent, JobState

    events = JobEvent.objects.filter(from_state=JobState.RUNNING, to_state=JobState.PREEMPTED)
    placements: dict[tuple[int, int | None, object], set[int]] = defaultdict(set)
    single = Allocation.objects.filter(job__num_nodes__isnull=True, job__num_gpus__lte=largest_server_gpus)
    for job_id, round_id, started_at, server_id in single.values_list(
        "job_id", "round_id", "started_at", "server_id"
    ):
        placements[(job_id, round_id, started_at if round_id is None else None)].add(server_id)
    split = [key for key, servers in placements.items() if len(servers) > 1]
    for event in events.filter(reason="moved").select_related("job__workload").order_by("at"):
        ended = list(Allocation.objects.filter(job=event.job, ended_at=event.at).select_related("server"))
        logger.info(
            "moved: job %d (%s, %d GPUs) after %.0f s on %s to %s, round %s",
            event.job_id,
            event.job.workload.name if event.job.workload else "own command",
            event.job.num_gpus,
            min(((event.at - a.started_at).total_seconds() for a in ended), default=float("nan")),
            "+".join(f"{a.server.name}:{a.num_gpus}/{a.num_cpus}c" for a in ended),
            "+".join(
                f"{a.server.name}:{a.num_gpus}/{a.num_cpus}c"
                for a in Allocation.objects.filter(job=event.job, round_id=event.data.get("round"))
            ),
            event.data.get("round"),
        )
    lost = Allocation.objects.filter(lost_work_s__isnull=False).aggregate(
        s=Sum(F("lost_work_s") * F("num_gpus"))
    )
    return {
        "starts": JobEvent.objects.filter(from_state=JobState.PENDING, to_state=JobState.RUNNING).count(),
        "moves": events.filter(reason="moved").count(),
        "preemptions": events.exclude(reason="moved").count(),
        "node_fails": JobEvent.objects.filter(to_state=JobState.NODE_FAIL).count(),
        "completed": JobEvent.objects.filter(to_state=JobState.COMPLETED).count(),
        "split_placements": len(split),
        "split_jobs": len({job_id for job_id, _, _ in split}),
        "lost_gpu_s": float(lost["s"] or 0.0),
    }


def run_once(args: argparse.Namespace, costs: bool) -> dict[str, float]:
    """One run of the live service with restart costs `costs` (module docstring)."""
    redis.Redis.from_url(args.redis).flushdb()
    knobs = {
        "ATTUNE_RESTART_COSTS": "1" if costs else "0",
        **({"ATTUNE_MIN_RUN_S": str(args.min_run_s)} if args.min_run_s is not None else {}),
        "ATTUNE_ROUND_S": str(args.round_s),  # whole seconds (settings read an int)
        **({"ATTUNE_MOVE_HORIZON_S": str(args.horizon_s)} if args.horizon_s else {}),
        **({"ATTUNE_MOVE_MARGIN": str(args.margin)} if args.margin is not None else {}),
    }
    with bench_database(args.db) as url:
        env = {**service_env(url, args.redis, args.sync_s), **knobs}
        # This process submits (admission forecasts, rounds asked of the worker): the service's settings.
        django_setup(
            url, **{k: v for k, v in env.items() if k.startswith(("ATTUNE_", "REDIS", "CELERY", "CACHE"))}
        )
        seed_demo_jobs(args)
        base = Path(tempfile.mkdtemp(prefix="attune-bench-moves-", dir="/tmp"))
        base.chmod(0o711)
        agents: list[subprocess.Popen] = []
        stop = threading.Event()
        try:
            with processes(env, workers=1) as (base_url, _pids):
                agents += [agent_start(f"gpu{i:02d}", base_url, args.time_scale, base) for i in (1, 2, 3)]
                threading.Thread(target=trickle, args=(stop, args), daemon=True).start()
                start = time.monotonic()
                joined = False
                while (elapsed := time.monotonic() - start) < args.minutes * 60:
                    if not joined and elapsed >= args.minutes * 60 / 2:
                        agents.append(agent_start("gpu04", base_url, args.time_scale, base))
                        joined = True
                        logger.info("gpu04 joins")
                    time.sleep(1)
                stop.set()
                result = counts(DEMO_SERVER["gpus"])
                for proc in agents:
                    proc.terminate()  # --stop-leases-on-exit: their jobs end with them
                for proc in agents:
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
        finally:
            stop.set()
            for proc in agents:
                if proc.poll() is None:
                    proc.kill()
            shutil.rmtree(base, ignore_errors=True)
    logger.info("costs %s: %s", "on" if costs else "off", result)
    return result


def report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    rows = []
    for label, r in results.items():
        per_start = r["moves"] / r["starts"] if r["starts"] else float("nan")
        rows.append(
            [label, r["starts"], r["moves"], r["preemptions"], per_start, r["split_placements"],
             r["split_jobs"], r["lost_gpu_s"] / 3600, r["completed"]]
        )  # fmt: skip
    print(
        f"\nthe demo's mix live for {args.minutes:g} min ({args.time_scale:g} time scale, 3 servers x 8 GPUs,"
        f" a fourth joining halfway; a job every {args.submit_every_s:g} s while < {args.max_pending} wait,"
        f" {args.job_s[0]:g}-{args.job_s[1]:g} s each; rounds every {args.round_s:g} s; min run"
        f" {'the default' if args.min_run_s is None else f'{args.min_run_s:g} s'} of the jobs' own time;"
        f" GPU-h lost in the jobs' own time)"
    )
    print_table(
        ["restart costs", "job starts", "moves", "preemptions", "moves/start", "split placements",
         "split jobs", "GPU-h lost", "completed"],
        rows,
    )  # fmt: skip
    if {"on", "off"} <= results.keys():
        on, off = results["on"], results["off"]
        rate = {k: (v["moves"] / v["starts"] if v["starts"] else float("nan")) for k, v in results.items()}
        print(
            f"moves per start with costs: {rate['on']:.3f} (off: {rate['off']:.3f}; "
            f"{rate['on'] / rate['off'] if rate['off'] else float('nan'):.2f}x); splits with costs: "
            f"{on['split_placements']} (off: {off['split_placements']}); acceptance: <= 0.1 moves per start "
            f"and 0 splits: {'yes' if rate['on'] <= 0.1 and on['split_placements'] == 0 else 'NO'}"
        )


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.5, help="length of each run (default 2.5)")
    parser.add_argument("--costs", choices=("both", "on", "off"), default="both")
    parser.add_argument("--time-scale", type=float, default=0.05, help="as `make demo` (default 0.05)")
    parser.add_argument("--submit-every-s", type=float, default=5.0, help="a new job this often (default 5)")
    parser.add_argument("--max-pending", type=int, default=4, help="only while fewer wait (default 4)")
    parser.add_argument(
        "--job-s", type=float, nargs=2, default=(20.0, 100.0), help="each job's length (default 20 100)"
    )
    parser.add_argument("--round-s", type=int, default=10, help="as `make demo` (default 10)")
    parser.add_argument(
        "--min-run-s",
        type=float,
        default=None,
        help="ATTUNE_MIN_RUN_S, in the jobs' own time like every restart figure (default: the service's)",
    )
    parser.add_argument("--horizon-s", type=float, default=None, help="ATTUNE_MOVE_HORIZON_S")
    parser.add_argument("--margin", type=float, default=None, help="ATTUNE_MOVE_MARGIN")
    parser.add_argument("--sync-s", type=float, default=2.0, help="the agents' sync interval (default 2)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db", default="attune_bench_moves", help="database to create and drop")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13", help="Redis database (flushed)")
    parser.add_argument("--json-out", default=None, help=argparse.SUPPRESS)  # a child run's result
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 60 or not 0 < args.job_s[0] <= args.job_s[1]:
        parser.error("--minutes must be in (0, 60] and --job-s two increasing positive lengths")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    logging_setup()
    if args.costs != "both":
        result = run_once(args, costs=args.costs == "on")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result))
        else:
            report({args.costs: result}, args)
        return 0
    results = {}
    given = list(argv if argv is not None else sys.argv[1:])
    forwarded = [
        a for i, a in enumerate(given) if not a.startswith("--costs") and given[i - 1 : i] != ["--costs"]
    ]
    for costs in ("on", "off"):  # each in a process of its own: Django is set up once per process
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.live_moves",
                    *forwarded,
                    "--costs",
                    costs,
                    "--json-out",
                    out.name,
                ],
                cwd=REPO_ROOT,
                check=True,
            )
            results[costs] = json.loads(Path(out.name).read_text())
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
