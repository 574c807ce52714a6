"""`manage.py demo`: the whole of Attune on one machine: web, scheduling rounds and three fake-GPU agents."""

from __future__ import annotations

import _thread
import copy
import logging
import logging.config
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django.utils import timezone

from cluster_app.models import NodeState, Server
from cluster_app.services import GpuSpec, agent_credential_issue, server_create
from profiles_app.models import Workload
from scheduler_app.management.demo_setup import (
    DemoIdentity,
    closed_to_others,
    demo_identity_ensure,
    die_with_parent,
    log_tail,
    port_taken,
)
from scheduler_app.models import Job, JobState, Team
from scheduler_app.services import JobRequest, job_submit
from scheduler_app.services.nodes import periodic_sweep_run
from scheduler_app.services.rounds import scheduling_round_run

AGENT_NAMES = ("gpu01", "gpu02", "gpu03")


class Command(BaseCommand):
    help = (
        "Run the embedded demo: seed users, teams and the catalog, start three node agents with fake GPUs "
        "(8 GPUs, 24 cores, 500 GB each) running synthetic training jobs, run scheduling rounds in this "
        "process, keep submitting a job now and then, and serve the web UI. Ctrl-C stops everything."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--addr", default="127.0.0.1:8000", help="address to serve (default 127.0.0.1:8000)"
        )
        parser.add_argument("--round-s", type=float, default=10.0, help="seconds between rounds (default 10)")
        parser.add_argument(
            "--time-scale",
            type=float,
            default=0.05,
            help="synthetic jobs run this much faster (default 0.05)",
        )
        parser.add_argument("--submit-every-s", type=float, default=30.0, help="a new demo job this often")
        parser.add_argument(
            "--agent-dir",
            type=Path,
            default=None,
            help="the agents' spools, work directories and logs (default var/agent/)",
        )
        parser.add_argument(
            "--max-pending",
            type=int,
            default=4,
            help="submit only while fewer demo jobs than this wait (default 4): a short, moving queue",
        )

    def handle(self, *args, **opts) -> None:
        if not settings.ATTUNE_SCHEDULER["inline_rounds"]:
            raise CommandError(
                "the demo runs its rounds in this process: unset DATABASE_URL (the embedded SQLite "
                "database, as `make demo` does) or set ATTUNE_INLINE_ROUNDS=1"
            )
        if opts["verbosity"] < 2:
            self._quiet_logging()
        # The forecasts must know this demo's round length (its rounds run in this process).
        settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "round_s": opts["round_s"]}
        # Before any agent starts: runserver ends this process with os._exit on a taken port.
        taken = port_taken(opts["addr"])
        if taken:
            raise CommandError(
                f"{taken}; choose another port: make demo PORT=9100 (or --addr 127.0.0.1:9100)"
            )
        call_command("seed_demo", servers=0, verbosity=0)
        identity = demo_identity_ensure()
        url = f"http://{opts['addr']}"
        agent_dir = opts["agent_dir"] or Path(settings.VAR_DIR) / "agent"
        started_at = timezone.now()  # "ready": registered by this demo's agents, not a previous run's
        agents = {name: self._start_agent(name, url, opts["time_scale"], agent_dir) for name in AGENT_NAMES}
        # `kill` (SIGTERM) stops the demo like Ctrl-C: through the finally below, agents and their jobs too
        # (Python's default would end this process alone and leave the agents running). The agents'
        # watcher stops it the same way (a SIGINT would do nothing where it is ignored, as in a job
        # started in the background by a non-interactive shell).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        self._failure = ""
        stop = threading.Event()
        threading.Thread(target=self._rounds, args=(stop, opts["round_s"]), daemon=True).start()
        threading.Thread(
            target=self._trickle,
            args=(stop, opts["submit_every_s"], opts["max_pending"], opts["time_scale"]),
            daemon=True,
        ).start()
        threading.Thread(
            target=self._watch_agents,
            args=(stop, url, identity, agents, agent_dir, started_at),
            daemon=True,
        ).start()
        self.stdout.write(f"demo: starting the web server at {url}/ and three agents (logs in {agent_dir}/)")
        try:
            call_command("runserver", opts["addr"], use_reloader=False)
        finally:
            stop.set()
            for proc in agents.values():
                proc.terminate()  # started with --stop-leases-on-exit: the agent stops its jobs too
            for proc in agents.values():
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if self._failure:
                raise CommandError(self._failure)

    @staticmethod
    def _quiet_logging() -> None:
        """Warnings and errors only, so that "demo ready" stays the last line until something goes wrong
        (-v 2: every round, registration and request). In settings.LOGGING, not on the loggers alone:
        runserver sets Django up again, which applies settings.LOGGING anew."""
        quiet = copy.deepcopy(settings.LOGGING)
        quiet["root"]["level"] = "WARNING"
        # Without Django's DEBUG-only console handler too, which printed each of its warnings twice.
        quiet.setdefault("loggers", {})["django"] = {"level": "WARNING"}
        quiet["loggers"].setdefault("django.server", {})["level"] = "WARNING"
        settings.LOGGING = quiet
        logging.config.dictConfig(quiet)

    def _start_agent(self, name: str, url: str, time_scale: float, agent_dir: Path) -> subprocess.Popen:
        server = Server.objects.filter(name=name).first() or server_create(
            name=name,
            num_cpus=24,
            mem_gb=500.0,
            gpus=[GpuSpec(index=i, uuid=f"unregistered-{name}-{i}") for i in range(8)],
            state=NodeState.NOT_RESPONDING,
            registered=False,  # placeholders until the agent below registers its fake GPUs
        )
        token = agent_credential_issue(server=server)
        base = agent_dir / name
        base.mkdir(parents=True, exist_ok=True)
        log = (base / "agent.log").open("a")
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent",
                "--server",
                url,
                "--name",
                name,
                "--fake-gpus",
                "8",
                "--fake-cpus",
                "24",
                "--fake-mem-gb",
                "500",
                "--time-scale",
                str(time_scale),
                "--spool-dir",
                str(base / "spool"),
                "--work-dir",
                str(base / "work"),
                "--stop-leases-on-exit",
                # One machine: every node's peers reach it on the loopback (multi-node rendezvous).
                "--address",
                "127.0.0.1",
            ],
            cwd=settings.BASE_DIR,
            # The token goes in the environment, not argv, where any user of the node could read it.
            env={**os.environ, "ATTUNE_AGENT_TOKEN": token},
            stdout=log,
            stderr=subprocess.STDOUT,
            # Started before the demo's threads: one prctl in the child, no lock it could inherit taken.
            preexec_fn=die_with_parent,
        )

    def _rounds(self, stop: threading.Event, round_s: float) -> None:
        """Embedded mode has no Celery beat: run the periodic round and sweep (silent servers, jobs past
        their time limit: the beat's task) here."""
        while not stop.wait(round_s):
            try:
                periodic_sweep_run()
                scheduling_round_run(trigger="beat")
            except Exception:  # keep the demo alive; the error is in the log
                self.stderr.write("demo: round failed (see the log)")
            finally:
                close_old_connections()

    def _watch_agents(
        self,
        stop: threading.Event,
        url: str,
        identity: DemoIdentity,
        agents: dict[str, subprocess.Popen],
        agent_dir: Path,
        started_at: datetime,
        timeout_s: float = 120.0,
    ) -> None:
        """Say the demo is ready once its agents registered, naming them (not before: "0 servers"), as the
        last line; then, for as long as the demo runs, stop it when one of its agents exits (one that
        finds its spool locked by another demo's agent exits after registering), naming it with the end
        of its log."""
        deadline = time.monotonic() + timeout_s
        announced = warned = False
        while not stop.wait(1.0):
            dead = {name: proc.returncode for name, proc in agents.items() if proc.poll() is not None}
            if dead:
                for name, code in dead.items():
                    tail = log_tail(agent_dir / name / "agent.log")
                    self.stderr.write(f"demo: agent {name} exited (code {code}); its log ends:\n{tail}")
                self._failure = "an agent stopped (see above); the demo stopped with it"
                # runserver ends, the finally of handle() stops the other agents. Asked again until that
                # finally has begun (it sets `stop`): a SIGTERM handled while the main thread runs a
                # weakref callback or a __del__ raises its SystemExit there, where Python ignores it
                # (seen under load: the demo then ran on without its agent).
                while True:
                    _thread.interrupt_main(signal.SIGTERM)
                    if stop.wait(2.0):
                        return
            if announced:
                continue
            try:
                ready = list(
                    Server.objects.filter(name__in=AGENT_NAMES, heartbeat__at__gte=started_at)
                    .exclude(agent_version="")
                    .order_by("name")
                )
            finally:
                close_old_connections()
            if len(ready) == len(AGENT_NAMES):
                self._announce(url, identity, ready)
                announced = True
            elif time.monotonic() > deadline and not warned:
                self.stderr.write(f"demo: not every agent registered yet; see {agent_dir}/*/agent.log")
                warned = True

    def _announce(self, url: str, identity: DemoIdentity, ready: list[Server]) -> None:
        closed = closed_to_others(Path(settings.BASE_DIR)) if os.geteuid() == 0 else None
        if closed is not None:
            self.stderr.write(
                f"demo: {closed} is closed to other accounts (mode {closed.stat().st_mode & 0o777:o}), so "
                "catalog workloads (run as nobody with this checkout's packages) fail to start; clone into "
                "a directory others can read, e.g. /opt or /srv"
            )
        if identity.unix_user:
            self.stdout.write(
                f"demo: own commands and scripts of the demo users run as {identity.note}, by default in "
                f"{identity.home}; give -D/--chdir a directory it can enter and write (README.md)"
            )
        else:
            self.stdout.write(
                f"demo: own commands of the demo users cannot run: {identity.note}; catalog workloads can"
            )
        servers = ", ".join(
            f"{s.name} ({s.num_gpus} GPUs, {s.num_cpus} cores, {s.mem_gb:g} GB)" for s in ready
        )
        scale = ready[0].time_scale
        self.stdout.write(
            self.style.SUCCESS(
                f"demo ready: {url}/ (login admin / admin) with {servers}; fake GPUs, jobs run "
                f"{1 / scale:g}x faster than their profiles"
            )
        )

    def _trickle(self, stop: threading.Event, every_s: float, max_pending: int, time_scale: float) -> None:
        """Submit a random catalog job now and then, so a newcomer sees the queue move; only while fewer
        than `max_pending` wait, so that the queue stays short instead of flooding."""
        rng = random.Random(7)
        while not stop.wait(every_s):
            try:
                if Job.objects.filter(state=JobState.PENDING).count() >= max_pending:
                    continue
                team = rng.choice(list(Team.objects.prefetch_related("members")))
                owner = team.members.first() or get_user_model().objects.get(username="admin")
                workload = rng.choice(list(Workload.objects.exclude(name__in=["bert", "vae"])))
                # As the API and the form: admission on (a prediction at submission, an early round).
                job_submit(
                    owner=owner,
                    request=JobRequest(
                        name=f"{workload.name}-{int(time.time()) % 100000}",
                        num_gpus=rng.choice([1, 1, 1, 2, 4]),
                        # 2 to 10 minutes of wall time at the fake nodes' speed.
                        total_iters=int(rng.uniform(120, 600) / (workload.iter_time_s * time_scale)),
                        workload=workload,
                        team=team,
                    ),
                )
            except Exception:
                self.stderr.write("demo: could not submit a demo job")
            finally:
                close_old_connections()
