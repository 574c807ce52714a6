"""`manage.py profile_workload NAME [--genie]`: queue a Synergy (or GENIE) profiling run of a workload."""

import shlex

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from profiles_app.genie_profiling import genie_profiling_run_queue
from profiles_app.models import ACTIVE_PROFILING_STATES, Workload
from profiles_app.services.profiling_runs import profiling_run_queue
from profiles_app.services.workloads import workload_register
from scheduler_app.services.profiling import enqueue_profile_task


class Command(BaseCommand):
    help = (
        "Queue a profiling run of a workload; an agent with a free GPU measures it and the workload's "
        "matrix is replaced by the measured one. --register creates the workload first (unprofiled). "
        "--genie queues GENIE's lightweight profile instead (batch sizes, 2 GPUs, 2 servers): its "
        "predictor fit is stored (docs/genie.md)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--register", action="store_true", help="create the workload if it is missing")
        parser.add_argument("--argv", default="", help='its command, e.g. "python -m agent.torch_workload"')
        parser.add_argument("--dataset-gb", type=float, default=0.0)
        parser.add_argument("--samples", type=int, default=0, help="samples in the dataset")
        parser.add_argument("--batch", type=int, default=0, help="samples per iteration per GPU")
        parser.add_argument("--iters-per-point", type=int, default=50)
        parser.add_argument("--genie", action="store_true", help="GENIE's lightweight profile instead")
        parser.add_argument(
            "--max-s-per-config",
            type=float,
            default=None,
            help="GENIE: stop each configuration after this many seconds (default: settings)",
        )

    def handle(self, *args, **options) -> None:
        name = options["name"]
        with transaction.atomic():
            workload = Workload.objects.filter(name=name).first()
            if workload is None:
                if not options["register"]:
                    raise CommandError(f"no workload {name!r} (use --register to create it)")
                workload = workload_register(
                    name=name,
                    argv=shlex.split(options["argv"]),
                    dataset_gb=options["dataset_gb"],
                    dataset_samples=options["samples"],
                    batch_size=options["batch"],
                )
            if workload.profiling_runs.filter(status__in=ACTIVE_PROFILING_STATES).exists():
                raise CommandError(f"{name} already has a profiling run queued or running")
            if options["genie"]:
                run = genie_profiling_run_queue(
                    workload=workload, max_s_per_config=options["max_s_per_config"]
                )
            else:
                run = profiling_run_queue(workload=workload, iters_per_point=options["iters_per_point"])
            transaction.on_commit(lambda: enqueue_profile_task(run.pk))
        self.stdout.write(f"profiling run {run.pk} of {name} queued (lease {run.lease_id})")
