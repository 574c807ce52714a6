"""Agent commands: what brings a node to the state the scheduler decided, rendezvous included."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.db import connection
from django.utils import timezone

from cluster_app.conf import node_conf
from cluster_app.models import NodeState, Server
from profiles_app.models import ProfilingRun, ProfilingRunStatus
from profiles_app.selectors import (
    profiling_commands,
    workload_launch,
)
from scheduler_app.conf import scheduler_conf
from scheduler_app.job_paths import default_output_pattern, output_path_expand
from scheduler_app.models import (
    Allocation,
    Job,
    JobState,
)
from scheduler_app.selectors.lease_starts import held_gpu_uuids, job_part_rows, leases_to_start

# Lease end reasons after which a still-running process is stopped gracefully (checkpoint) rather
# than cancelled.
PREEMPT_END_REASONS = frozenset({"preempted"})
# A lease ended because its server stopped answering: no agent will confirm its exit.
NODE_FAIL_END_REASON = "node_fail"


@dataclass(frozen=True)
class JobPart:
    """One server's part of a running job, in rank order (the order its leases were created in)."""

    allocation_id: int
    server_name: str
    address: str
    num_gpus: int
    rendezvous_port: int | None


def job_parts(*, job_ids: Iterable[int]) -> dict[int, list[JobPart]]:
    """Each job's active leases as rendezvous parts, rank 0 first (one query for all the jobs)."""
    parts: dict[int, list[JobPart]] = defaultdict(list)
    for job_id, allocation_id, name, address, hostname, num_gpus, port in job_part_rows(job_ids=job_ids):
        parts[job_id].append(JobPart(allocation_id, name, address or hostname or name, num_gpus, port))
    return parts


def node_rank_of(allocation: Allocation, parts: Sequence[JobPart]) -> int:
    """The allocation's place among its job's parts (0 when it is the only one)."""
    ranks = [p.allocation_id for p in parts]
    return ranks.index(allocation.pk) if allocation.pk in ranks else 0


def rendezvous_env(job: Job, node_rank: int, parts: Sequence[JobPart]) -> dict[str, str]:
    """torchrun's and Slurm's variables for one part of a job: where rank 0 listens, which node this is,
    how many processes in all. Every part of a job gets the same MASTER_ADDR/MASTER_PORT."""
    master = parts[0] if parts else None
    local = parts[node_rank].num_gpus if parts else job.num_gpus
    env = {
        "NNODES": str(max(1, len(parts))),
        "NODE_RANK": str(node_rank),
        "WORLD_SIZE": str(sum(p.num_gpus for p in parts) or job.num_gpus),
        "LOCAL_WORLD_SIZE": str(local),
        "SLURM_JOB_ID": str(job.id),
        "SLURM_JOB_NAME": job.name,
        "SLURM_NNODES": str(max(1, len(parts))),
        "SLURM_NODEID": str(node_rank),
        "SLURM_JOB_NODELIST": ",".join(p.server_name for p in parts),
        "SLURM_GPUS_ON_NODE": str(local),
    }
    if master is not None and master.rendezvous_port is not None:
        # A job on one server rendezvouses with itself: loopback, so no firewall is in the way.
        env["MASTER_ADDR"] = master.address if len(parts) > 1 else "127.0.0.1"
        env["MASTER_PORT"] = str(master.rendezvous_port)
    return env


def _start_command(allocation: Allocation, parts: Sequence[JobPart], gpu_uuids: list[str]) -> dict[str, Any]:
    job = allocation.job
    env = {"ATTUNE_JOB_ID": str(job.id), "ATTUNE_MEM_GB": f"{allocation.mem_gb:g}"}
    if job.array_job_id is not None:
        # Slurm's names too, so that a sweep script ported from sbatch --array runs unchanged.
        for prefix in ("ATTUNE", "SLURM"):
            env[f"{prefix}_ARRAY_JOB_ID"] = str(job.array_job_id)
            env[f"{prefix}_ARRAY_TASK_ID"] = str(job.array_task_id)
    node_rank = node_rank_of(allocation, parts)
    env.update(rendezvous_env(job, node_rank, parts))
    command: dict[str, Any] = {
        "kind": "start",
        "lease_id": str(allocation.lease_id),
        "job_id": job.id,
        "job_name": job.name,
        "env": env,
        "gpu_uuids": gpu_uuids,
        "num_cpus": allocation.num_cpus,
        "mem_gb": allocation.mem_gb,
        "resume_iters": job.done_iters,
        "run_as": None,
    }
    if job.workload is not None:
        argv, workload_env = workload_launch(job.workload, iters=job.total_iters)
        env.update(workload_env)
        command["argv"] = argv
        return command
    # An own command or script runs as its owner's account, in its working directory, writing the
    # files it asked for (the agent resolves relative paths against the working directory).
    pattern = job.output_path or default_output_pattern(
        array=job.array_job_id is not None, num_nodes=len(parts)
    )

    def expand(p: str) -> str:
        return output_path_expand(
            p,
            job_id=job.id,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            name=job.name,
            user=job.run_as,
            node_rank=node_rank,
            node_name=parts[node_rank].server_name if parts else allocation.server.name,
        )

    command.update(
        run_as=job.run_as,
        workdir=job.work_dir,
        stdout_path=expand(pattern),
        stderr_path=expand(job.error_path) if job.error_path else "",
    )
    if job.script:
        command.update(argv=[], script=job.script)
    else:
        command["argv"] = ["sh", "-c", job.command]
    return command


def live_leases_sql() -> str:
    """`_live_leases`' statement; its parameters: the server, RUNNING, the profiling run's RUNNING and
    the server twice.

    The job's state is read by its primary key, lease by lease: the server's few leases come first
    whatever the planner's statistics say. Prepared, the statement gets a generic plan after five runs;
    with no statistics yet (a new database, or autovacuum behind), a join's plan once started from
    every RUNNING job (the index on the job's state) and looked for this server's leases among them:
    13 ms a sync instead of 0.05 at 3,000 running jobs, half of PostgreSQL's time under the fleet
    (2026-11-27).
    """
    qn = connection.ops.quote_name
    allocation, job, run = (qn(m._meta.db_table) for m in (Allocation, Job, ProfilingRun))
    return (
        f"SELECT a.lease_id, 0, a.num_cpus, a.mem_gb FROM {allocation} a"
        f" WHERE a.server_id = %s AND a.ended_at IS NULL"
        f" AND (SELECT j.state FROM {job} j WHERE j.id = a.job_id) = %s"
        f" UNION ALL SELECT NULL, 1, NULL, NULL WHERE EXISTS"
        # A GENIE run's peer server measures its part too (profiles_app/genie_profiling.py).
        f" (SELECT 1 FROM {run} p WHERE p.status = %s AND (p.server_id = %s"
        f" OR (p.peer_server_id = %s AND p.peer_released_at IS NULL)))"
    )


def _live_leases(server_id: int) -> tuple[set[UUID], bool]:
    """The ids of the server's live leases (not ended, job RUNNING), and whether a profiling run runs
    on it (`_live_lease_sizes` without the sizes)."""
    sizes, profiling = _live_lease_sizes(server_id)
    return set(sizes), profiling


def _live_lease_sizes(server_id: int) -> tuple[dict[UUID, tuple[int, float]], bool]:
    """The server's live leases (not ended, job RUNNING) with their size (cores, memory GB), and
    whether a profiling run runs on it: one hand-written statement, as every sync of every agent asks
    it. The ORM builds the same SQL for 2 to 3 ms of CPU each time (10 to 30 times what running it
    costs), which a thousand agents pay a hundred times a second."""
    with connection.cursor() as cursor:
        params = [server_id, JobState.RUNNING.value, ProfilingRunStatus.RUNNING.value, server_id, server_id]
        cursor.execute(live_leases_sql(), params)
        rows = cursor.fetchall()
    # PostgreSQL hands back UUIDs, SQLite their 32 hex digits.
    live = {
        (v if isinstance(v, UUID) else UUID(v)): (int(cpus), float(mem_gb))
        for v, is_run, cpus, mem_gb in rows
        if not is_run
    }
    return live, any(row[1] for row in rows)


def resize_commands(
    live: dict[UUID, tuple[int, float]], applied: dict[UUID, tuple[int, float]]
) -> list[dict[str, Any]]:
    """A `resize` for each live lease whose size the agent says it applies (`applied`, the sync's
    `sizes`: only agents with the `resize` feature send them) and which a round has changed since
    (docs/agent.md, "Resizing in place"). Recomputed on every sync, like the other commands, so a lost
    answer is repeated and a resize the agent has applied is not sent again."""
    commands = []
    for lease_id, (cpus, mem_gb) in sorted(applied.items(), key=lambda item: str(item[0])):
        size = live.get(lease_id)
        if size is None or (size[0] == cpus and abs(size[1] - mem_gb) <= 1e-6):
            continue
        commands.append({"kind": "resize", "lease_id": str(lease_id), "num_cpus": size[0], "mem_gb": size[1]})
    return commands


def agent_commands(
    *, server: Server, running: Iterable[UUID], sizes: dict[UUID, tuple[int, float]] | None = None
) -> list[dict[str, Any]]:
    """The commands that bring `server` to the state the scheduler decided, from database state only.

    - start: an active lease of this server whose job is RUNNING and which the agent does not run,
      once no earlier lease of the job may still run (`leases_to_start`);
    - preempt / cancel: a lease the agent runs that the service has ended (preempted by a round, or
      ended for any other reason: cancelled, finished elsewhere, node failure), or does not know;
    - drain: the server is DRAINING or DRAINED;
    - profile: a running profiling run on this server (docs/profiling.md); its lease id is live;
    - resize: a live lease the agent runs at another size than a round gave it (`sizes`: what the
      agent applies, sent by agents with the `resize` feature; `resize_commands`).
    Computed afresh on every sync, so a lost answer is simply repeated by the next one.
    """
    running = set(running)
    # Most syncs change nothing: the live leases' ids first (one light query), and the leases to
    # start, with their jobs, GPUs and rendezvous, and the profiling commands only when there are some.
    live_sizes, profiling = _live_lease_sizes(server.pk)
    live = set(live_sizes)
    commands: list[dict[str, Any]] = resize_commands(live_sizes, sizes) if sizes else []
    if live - running:
        # A moved job (or one sent back to the queue and placed again) starts its next lease only
        # once every earlier lease of it has exited or is surely stopped by its node's fence: the old
        # process may still be writing its checkpoint during its grace period, or run on a node that
        # cannot hear the service, and the new one would resume from a stale checkpoint, or train beside
        # it, otherwise (docs/faults.md, "Fencing").
        to_start = leases_to_start(
            lease_ids=live - running,
            fenced_before=timezone.now() - timedelta(seconds=node_conf().fence_expiry_s),
        )
        # The rendezvous needs every part of those jobs, on whichever server.
        parts = job_parts(job_ids=(a.job_id for a in to_start))
        gpus = held_gpu_uuids(allocation_ids=(a.pk for a in to_start))
        commands += [_start_command(a, parts.get(a.job_id, []), gpus.get(a.pk, [])) for a in to_start]
    for command in profiling_commands(server=server) if profiling else []:
        live.add(UUID(command["lease_id"]))
        commands.append(command)
    stale = running - live
    if stale:
        conf = scheduler_conf()  # only here: a sync that stops nothing, most of them, needs none of it
        ended = dict(
            Allocation.objects.filter(server=server, lease_id__in=stale).values_list("lease_id", "end_reason")
        )
        for lease_id in sorted(stale, key=str):
            if ended.get(lease_id) in PREEMPT_END_REASONS:
                commands.append(
                    {"kind": "preempt", "lease_id": str(lease_id), "grace_s": conf.preempt_grace_s}
                )
            else:
                commands.append({"kind": "cancel", "lease_id": str(lease_id), "grace_s": conf.cancel_grace_s})
    if server.state in (NodeState.DRAINING, NodeState.DRAINED):
        commands.append({"kind": "drain"})
    return commands
