"""A job submission's request: what a user may ask for, its limits, and its validation before anything
is written (services/jobs.py stores what passes)."""

import math
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from cluster_app.models import Server
from cluster_app.selectors import server_shapes
from profiles_app.models import Workload
from scheduler_app.job_accounts import run_as_problem
from scheduler_app.job_paths import MAX_PATH_CHARS, output_pattern_problem
from scheduler_app.models import TERMINAL_JOB_STATES, Job, JobState, Team
from scheduler_app.selectors import job_manageable

# A script's job name when neither the request nor its --job-name gives one and it has no file name.
SCRIPT_JOB_NAME = "batch-script"


@dataclass(frozen=True)
class JobRequest:
    """What a user asks for; validated by job_submit before anything is written."""

    name: str
    num_gpus: int
    total_iters: int | None = None  # required for a catalog workload; an own command may omit it
    workload: Workload | None = None
    command: str = ""
    script: str = ""  # a batch script run by bash (its directives already merged by the caller)
    num_nodes: int | None = None  # exactly this many servers (--nodes); None: see job_num_nodes
    work_dir: str = ""  # --chdir; empty: submit_dir, else the account's home on the node
    submit_dir: str = ""  # where the command line was run (sbatch's default working directory)
    output_path: str = ""  # --output pattern (%j %A %a %x %u %%); empty: attune-%j.out
    error_path: str = ""  # --error pattern; empty: with stdout
    team: Team | None = None
    cpus_per_gpu: float | None = None
    mem_gb_per_gpu: float | None = None
    qos_deadline_at: datetime | None = None
    qos_max_latency_s: float | None = None
    qos_min_rate_iters_per_s: float | None = None  # GENIE's other QoS kind: iterations/s while running
    priority: int = 0
    time_limit_s: int | None = None
    checkpoint_every_s: float | None = None  # how often it checkpoints (--checkpoint-every); None: see Job
    depends_on: tuple[int, ...] = ()  # ids of jobs that must complete first (Slurm's afterok)
    hold: bool = False  # submitted held (sbatch --hold): it waits for job_release
    array: str = ""  # Slurm's --array: "0-9", "1,3,5-7", "0-15:4", "0-99%4"; one job per task index


MAX_SCRIPT_CHARS = 256 * 1024
# The smallest shares worth asking for: below them a job's per-GPU demand is a rounding error, and
# 5e-324 cores per GPU made the allocators divide a server's cores into infinity.
MIN_CPUS_PER_GPU = 0.01
MIN_MEM_GB_PER_GPU = 0.01
MIN_QOS_LATENCY_S = 1.0
MIN_CHECKPOINT_EVERY_S = 1.0  # a checkpoint interval under a second is a unit mistake
# A rate target: above 0 (a rate of 0 promises nothing); 10^9 iterations/s is beyond any training step.
MIN_QOS_RATE_ITERS_PER_S = 1e-9
MAX_QOS_RATE_ITERS_PER_S = 1e9
# `sh -c COMMAND` passes the command as one argument; Linux caps one argument at 128 KiB.
MAX_COMMAND_CHARS = 64 * 1024

# More would be a workflow engine's job, not a queue's; Slurm users chain a few steps.
MAX_DEPENDENCIES = 64
# Slurm's default MaxArraySize is 1001 (indices 0-1000); a sweep larger than that is a mistake here.
MAX_ARRAY_TASKS = 1000
MAX_ARRAY_INDEX = 1_000_000
# Bounds of what a user may ask for, from what the cluster and its model can mean (not column limits):
# a year is longer than any job or wait anyone plans; 10^12 iterations is beyond any training run.
MAX_TOTAL_ITERS = 10**12
MAX_DURATION_S = 365 * 86400  # a time limit, a maximum latency
MAX_DEADLINE_AHEAD = timedelta(days=5 * 365)
MAX_JOB_ID = 2**63 - 1  # ids are 64-bit


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """What an --array value asks for: the task indices, and how many may run at once."""

    task_ids: tuple[int, ...]  # sorted, each once
    limit: int | None = None  # "%N": at most N tasks running at once (Slurm's ArrayTaskThrottle)


def parse_array_spec(spec: str) -> ArraySpec:
    """Slurm's --array syntax: "0-9", "1,3,5-7", "0-15:4" (a step), each optionally followed by
    "%N", at most N tasks running at once ("0-99%4"). Raises ValueError saying what is wrong."""
    text, percent, limit_text = spec.strip().partition("%")
    limit: int | None = None
    if percent:
        limit_text = limit_text.strip()
        if not re.fullmatch(r"[0-9]+", limit_text):
            raise ValueError(f"“%{limit_text}” is not a limit: write %N after the indices, e.g. 0-99%4")
        limit = int(limit_text)
        if not 1 <= limit <= MAX_ARRAY_TASKS:
            raise ValueError(f"a limit on simultaneous tasks (%N) is from 1 to {MAX_ARRAY_TASKS}")
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        # ASCII digits only (Python's \d also takes other scripts' digits; the schema's pattern does not).
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?", part)
        if not match:
            raise ValueError(f"“{part}” is not an index or a range: use e.g. 0-9, 1,3,5-7 or 0-15:4")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first or step < 1:
            raise ValueError(f"“{part}” is an empty range")
        if last > MAX_ARRAY_INDEX:
            raise ValueError(f"task indices go up to {MAX_ARRAY_INDEX}")
        if (last - first) // step + 1 + len(ids) > MAX_ARRAY_TASKS:
            raise ValueError(f"an array has at most {MAX_ARRAY_TASKS} tasks")
        ids.update(range(first, last + 1, step))
    if not ids:
        raise ValueError("give the task indices, e.g. 0-9")
    return ArraySpec(tuple(sorted(ids)), limit)


def job_run_as(owner: AbstractBaseUser) -> str:
    """The Unix account the owner's own commands run as: the one staff set (UnixAccount), else the
    owner's username (resolved on each node through its user database, as Slurm does)."""
    account = getattr(owner, "unix_account", None)
    return account.unix_user if account is not None else owner.get_username()


def job_work_dir(request: JobRequest) -> str:
    """Where an own command runs: --chdir (relative to the submission directory, as sbatch), else the
    submission directory, else empty (the account's home on the node)."""
    if not request.work_dir:
        return request.submit_dir
    return posixpath.normpath(posixpath.join(request.submit_dir, request.work_dir))


def dependency_ids(ids: Iterable[int]) -> list[int]:
    """The jobs to wait for: each id, and every task of an array named by its id (as Slurm's afterok
    on an ArrayJobID waits for the whole array)."""
    ids = set(ids)
    return sorted(ids | set(Job.objects.filter(array_job_id__in=ids).values_list("pk", flat=True)))


def _validate_dependencies(request: JobRequest, owner: AbstractBaseUser, add) -> dict[int, str]:
    """The state of each job to wait for (arrays expanded); what is wrong goes to `add`."""
    if len(set(request.depends_on)) > MAX_DEPENDENCIES:
        add("depends_on", f"A job may wait for at most {MAX_DEPENDENCIES} jobs.")
        return {}
    ids = set(dependency_ids(request.depends_on))
    found = dict(job_manageable(user=owner).filter(pk__in=ids).values_list("pk", "state"))
    missing = sorted(ids - found.keys())
    if missing:
        add("depends_on", f"No job {', '.join(map(str, missing))} that you can see.")
    for job_id, state in sorted(found.items()):
        if state in TERMINAL_JOB_STATES and state != JobState.COMPLETED:
            add("depends_on", f"Job {job_id} ended {state}: a job after it could never start.")
    return found


def _validate_own_command(request: JobRequest, owner: AbstractBaseUser, add) -> None:
    """An own command or script: the account it would run as, its paths and its size."""
    problem = run_as_problem(job_run_as(owner))
    if problem:
        add("run_as", f"{problem} Ask staff to set the Unix account your jobs run as.")
    if len(request.script) > MAX_SCRIPT_CHARS:
        add("script", f"A script has at most {MAX_SCRIPT_CHARS // 1024} KiB.")
    if len(request.command) > MAX_COMMAND_CHARS:
        add(
            "command", f"A command has at most {MAX_COMMAND_CHARS // 1024} KiB; put a longer one in a script."
        )
    for field, path in (("output", request.output_path), ("error", request.error_path)):
        problem = output_pattern_problem(path)
        if problem:
            add(field, problem)
    if request.submit_dir and not request.submit_dir.startswith("/"):
        add("submit_dir", "Give an absolute path.")
    elif request.work_dir and not request.work_dir.startswith("/") and not request.submit_dir:
        # A relative --chdir follows the submission directory (job_work_dir), as sbatch's does.
        add("chdir", "Give an absolute path, or submit from a directory (a relative one follows it).")
    work_dir = job_work_dir(request)
    if len(work_dir) > MAX_PATH_CHARS or "\0" in work_dir:
        add("chdir", f"A working directory has at most {MAX_PATH_CHARS} characters and no NUL.")


def cluster_gpus_capacity() -> dict[str, int]:
    """cluster_capacity()'s servers, GPUs and the most GPUs one server has, which a submission checks:
    one written-out statement (the ORM's aggregate cost a submission more CPU to build than to run)."""
    table = connection.ops.quote_name(Server._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*), SUM(num_gpus), MAX(num_gpus) FROM {table}")
        servers, gpus, largest = cursor.fetchone()
    return {"servers": servers or 0, "gpus": gpus or 0, "largest_server_gpus": largest or 0}


def _validate_shape(request: JobRequest, add) -> None:
    """GPUs and servers: what the cluster could ever hold (an exact node count splits GPUs evenly)."""
    capacity = cluster_gpus_capacity()
    total_gpus, largest = capacity["gpus"], capacity["largest_server_gpus"]
    if total_gpus and request.num_gpus > total_gpus:
        add("num_gpus", f"The cluster has only {total_gpus} GPUs.")
        return
    nodes = request.num_nodes
    if nodes is None and request.workload is None:
        nodes = 1  # an own command never spreads unless it asks (job_num_nodes)
        if largest and request.num_gpus > largest:
            add(
                "nodes",
                f"No server has {request.num_gpus} GPUs (the largest has {largest}): "
                "ask for several servers with --nodes, and start your processes with the rendezvous "
                "variables (docs/cli.md).",
            )
        return
    if nodes is None:
        return
    if nodes < 1:
        add("nodes", "A job runs on at least one server.")
    elif request.num_gpus % nodes:
        add("nodes", f"{request.num_gpus} GPUs do not split evenly over {nodes} servers.")
    elif capacity["servers"] and nodes > capacity["servers"]:
        add("nodes", f"The cluster has only {capacity['servers']} servers.")
    elif largest and request.num_gpus // nodes > largest:
        add("nodes", f"{request.num_gpus // nodes} GPUs per server: the largest server has {largest}.")


def _gpus_on_one_server(request: JobRequest) -> int:
    """The fewest GPUs the job could have on one server: an exact node count splits them evenly, an
    own command without one runs on one server, a catalog workload may spread down to one per server."""
    if request.num_nodes:
        return max(1, request.num_gpus // request.num_nodes)
    return request.num_gpus if request.workload is None else 1


def _validate_fit(request: JobRequest, add) -> None:
    """Per-GPU cores and memory that no server could ever give: the job would wait forever, so say so
    now, with the largest server's shape."""
    cpus, mem = request.cpus_per_gpu, request.mem_gb_per_gpu
    if cpus is None and mem is None:
        return
    gpus = _gpus_on_one_server(request)
    shapes = [s for s in server_shapes() if s[1] >= gpus]
    if not shapes:
        return  # no servers yet, or too few GPUs on any: _validate_shape says so

    def fits(shape, cpus=cpus, mem=mem) -> bool:
        _, _, cores, mem_gb = shape
        return (cpus is None or cpus * gpus <= cores) and (mem is None or mem * gpus <= mem_gb)

    if any(fits(s) for s in shapes):
        return
    if cpus is not None and not any(fits(s, mem=None) for s in shapes):
        field, wanted, largest = "cpus_per_gpu", f"{cpus:g} cores", max(shapes, key=lambda s: s[2])
    elif mem is not None and not any(fits(s, cpus=None) for s in shapes):
        field, wanted, largest = "mem_gb_per_gpu", f"{mem:g} GB", max(shapes, key=lambda s: s[3])
    else:  # each fits somewhere, never both on one server
        field, wanted = "cpus_per_gpu", f"both {cpus:g} cores and {mem:g} GB"
        largest = max(shapes, key=lambda s: (s[2] / s[1], s[3] / s[1]))
    name, num_gpus, cores, mem_gb = largest
    on_one = f" for {gpus} GPUs on one server" if gpus > 1 else ""
    add(
        field,
        f"No server offers {wanted} per GPU{on_one}: the largest, {name}, has {cores} cores and "
        f"{mem_gb:g} GB for {num_gpus} GPUs, so the job could never run.",
    )


def _validate_deadline(deadline: datetime, add) -> None:
    try:
        if timezone.is_naive(deadline):
            deadline = timezone.make_aware(deadline)
        too_late = deadline > timezone.now() + MAX_DEADLINE_AHEAD
    except (OverflowError, ValueError):
        too_late = True
    if too_late:
        add("qos_deadline_at", f"A deadline is at most {MAX_DEADLINE_AHEAD.days // 365} years ahead.")


def job_request_validate(request: JobRequest, owner: AbstractBaseUser) -> tuple[ArraySpec, dict[int, str]]:
    """Raise ValidationError with per-field messages; nothing is written on bad input. Returns what
    the checks worked out: the array (no task indices for a single job) and each dependency's state."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    if not request.name.strip():
        add("name", "Give the job a name.")
    given = [bool(request.workload), bool(request.command.strip()), bool(request.script.strip())]
    if not any(given):
        add("workload", "Choose a catalog workload, or give a command or a batch script to run.")
    elif sum(given) > 1:
        add("workload", "Give one of a catalog workload, a command or a batch script, not several.")
    own = request.workload is None
    if own:
        _validate_own_command(request, owner, add)
    if request.num_gpus < 1:
        add("num_gpus", "A job needs at least one GPU.")
    else:
        _validate_shape(request, add)
    if request.total_iters is None:
        if not own:
            add("total_iters", "Give the work to do in iterations.")
    elif request.total_iters < 1:
        add("total_iters", "The work must be at least one iteration.")
    elif request.total_iters > MAX_TOTAL_ITERS:
        add("total_iters", f"The work is at most {MAX_TOTAL_ITERS:.0e} iterations.")
    per_gpu_ok = True
    for field, value, what, least in (
        ("cpus_per_gpu", request.cpus_per_gpu, "CPU cores per GPU", MIN_CPUS_PER_GPU),
        ("mem_gb_per_gpu", request.mem_gb_per_gpu, "Memory per GPU (GB)", MIN_MEM_GB_PER_GPU),
    ):
        if value is not None and not (math.isfinite(value) and value >= least):
            add(field, f"{what} must be at least {least:g}." if value < least else f"{what} must be finite.")
            per_gpu_ok = False
    if per_gpu_ok and request.num_gpus >= 1:
        _validate_fit(request, add)
    if request.time_limit_s is not None and not 1 <= request.time_limit_s <= MAX_DURATION_S:
        add("time_limit_s", f"A time limit is from 1 second to {MAX_DURATION_S // 86400} days.")
    every_s = request.checkpoint_every_s
    if every_s is not None and not (
        math.isfinite(every_s) and MIN_CHECKPOINT_EVERY_S <= every_s <= MAX_DURATION_S
    ):
        add(
            "checkpoint_every_s",
            f"The checkpoint interval is from {MIN_CHECKPOINT_EVERY_S:g} second "
            f"to {MAX_DURATION_S // 86400} days.",
        )
    if request.qos_deadline_at is not None and request.qos_max_latency_s is not None:
        add("qos_max_latency_s", "Give either a deadline or a maximum latency, not both.")
    rate = request.qos_min_rate_iters_per_s
    if rate is not None:
        if request.qos_deadline_at is not None or request.qos_max_latency_s is not None:
            add(
                "qos_min_rate_iters_per_s",
                "Give one QoS target: a deadline, a maximum latency or a minimum rate, not two.",
            )
        if not (math.isfinite(rate) and MIN_QOS_RATE_ITERS_PER_S <= rate <= MAX_QOS_RATE_ITERS_PER_S):
            add(
                "qos_min_rate_iters_per_s",
                f"The minimum rate must be a positive number of iterations per second "
                f"(at most {MAX_QOS_RATE_ITERS_PER_S:.0e}).",
            )
    if request.qos_max_latency_s is not None and not (
        math.isfinite(request.qos_max_latency_s)
        and MIN_QOS_LATENCY_S <= request.qos_max_latency_s <= MAX_DURATION_S
    ):
        add(
            "qos_max_latency_s",
            f"The maximum latency is from {MIN_QOS_LATENCY_S:g} second to {MAX_DURATION_S // 86400} days.",
        )
    if request.qos_deadline_at is not None:
        _validate_deadline(request.qos_deadline_at, add)
    if request.team is not None and not request.team.members.filter(pk=owner.pk).exists():
        add("team", f"You are not a member of team {request.team.name}.")
    dependencies = _validate_dependencies(request, owner, add) if request.depends_on else {}
    array = ArraySpec(())
    if request.array:
        try:
            array = parse_array_spec(request.array)
        except ValueError as exc:
            add("array", str(exc))
    if errors:
        raise ValidationError(errors)
    return array, dependencies
