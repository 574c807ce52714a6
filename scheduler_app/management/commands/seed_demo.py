"""`manage.py seed_demo` (demos only: admin/admin): a Synergy-like cluster, the catalog, users, jobs."""

import uuid

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from cluster_app.models import Server
from cluster_app.services import GpuSpec, server_create
from profiles_app.models import Workload
from profiles_app.services.workloads import workload_catalog_load
from scheduler_app.models import Job, Team
from scheduler_app.services import JobRequest, job_submit

DEMO_NAMESPACE = uuid.UUID("5b1c9f1e-7d1a-4c55-9a57-6a7e2f0c9d01")  # stable fake GPU UUIDs
DEMO_TEAMS = {"vision": ["alice"], "nlp": ["bob"], "speech": ["carol"]}
DEMO_JOBS = [  # (owner, team, workload, gpus, iterations)
    ("alice", "vision", "res18", 1, 20000),
    ("alice", "vision", "alexnet", 2, 15000),
    ("bob", "nlp", "transformer", 4, 8000),
    ("bob", "nlp", "lstm", 1, 100000),
    ("carol", "speech", "m5", 1, 12000),
    ("carol", "speech", "deepspeech", 2, 6000),
]


def demo_gpu_uuid(server_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(DEMO_NAMESPACE, f'{server_name}/{index}')}"


class Command(BaseCommand):
    help = (
        "Create a demo cluster (by default 4 servers x 8 GPUs, 24 CPU cores, 500 GB each, like the "
        "Synergy testbed), load the workload catalog, and add an admin user, teams and a few jobs. "
        "Safe to run twice: existing rows are kept. DEMO ONLY: it creates admin/admin and demo users; "
        "a real deployment runs `manage.py load_catalog` instead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--servers", type=int, default=4, help="number of servers (default 4)")
        parser.add_argument("--gpus", type=int, default=8, help="GPUs per server (default 8)")
        parser.add_argument("--cpus", type=int, default=24, help="CPU cores per server (default 24)")
        parser.add_argument(
            "--mem-gb", type=float, default=500.0, help="memory per server in GB (default 500)"
        )
        parser.add_argument(
            "--admin-password", default="admin", help="password of the demo admin (default admin)"
        )
        parser.add_argument("--no-jobs", action="store_true", help="do not submit the demo jobs")

    @transaction.atomic
    def handle(self, *args, **opts) -> None:
        created_servers = 0
        for i in range(opts["servers"]):
            name = f"gpu{i + 1:02d}"
            if Server.objects.filter(name=name).exists():
                continue
            server_create(
                name=name,
                hostname=f"{name}.demo.local",
                gpu_model="Tesla V100-SXM2-32GB",
                num_cpus=opts["cpus"],
                mem_gb=opts["mem_gb"],
                storage_mbps=500.0,
                nic_gbps=25.0,
                gpus=[
                    GpuSpec(index=g, uuid=demo_gpu_uuid(name, g), memory_mb=32768)
                    for g in range(opts["gpus"])
                ],
            )
            created_servers += 1
        workloads = workload_catalog_load().total

        User = get_user_model()
        admin, made = User.objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        if made:
            admin.set_password(opts["admin_password"])
            admin.save()
        for team_name, members in DEMO_TEAMS.items():
            team, _ = Team.objects.get_or_create(name=team_name, defaults={"gpu_quota": 16})
            for username in members:
                user, made = User.objects.get_or_create(username=username)
                if made:
                    user.set_password(opts["admin_password"])
                    user.save()
                team.members.add(user)

        submitted = 0
        if not opts["no_jobs"] and not Job.objects.exists():
            for owner, team_name, workload, gpus, iters in DEMO_JOBS:
                # Admission off: the seeds are the demo's starting queue, written before any agent or
                # round runs (no forecast to make yet); the first round places them.
                job_submit(
                    admission=False,
                    owner=User.objects.get(username=owner),
                    request=JobRequest(
                        name=f"{workload}-demo",
                        num_gpus=gpus,
                        total_iters=iters,
                        workload=Workload.objects.get(name=workload),
                        team=Team.objects.get(name=team_name),
                    ),
                )
                submitted += 1
        if opts["verbosity"] > 0:  # `demo` seeds quietly and says "ready" once its agents registered
            self.stdout.write(
                self.style.SUCCESS(
                    f"seeded: {Server.objects.count()} servers ({created_servers} new), {workloads} catalog "
                    f"workloads, {submitted} jobs submitted; admin login: admin / {opts['admin_password']}"
                )
            )
