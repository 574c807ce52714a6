"""Profiling on arrival, live: rounds hold jobs of unprofiled workloads, agents measure, profiles are used.

The agent's side is played through the real agent call (a sync: commands out, reports in), answering
each profile command with the workload's true speed at the core counts asked for.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from cluster_app.models import NodeState
from profiles_app.catalog import load_catalog
from profiles_app.models import (
    ProfilingKind,
    ProfilingReport,
    ProfilingRun,
    ProfilingRunStatus,
    SpeedObservation,
    Workload,
)
from profiles_app.optimistic import interpolate_seconds, relative_error
from profiles_app.services.profiling_runs import profiling_run_queue
from profiles_app.services.workloads import workload_register
from scheduler_app.models import JobEvent, JobState, PendingReason, RoundDecision
from scheduler_app.services.rounds import scheduling_round_run
from scheduler_app.tasks import workload_profile_task
from tests.api.helpers import agent_client, lease_of, make_server, submit, synced

pytestmark = pytest.mark.django_db
SEQ = itertools.count(1)


@pytest.fixture(autouse=True)
def fifo_tune(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
    }


def truth(model: str) -> dict:
    """A catalog model's matrix as the hidden ground truth of an 'unknown' workload."""
    p = load_catalog()[model]
    return {
        "iter_time_s": p.iter_time_s,
        "cpu_per_gpu_grid": list(p.cpu_per_gpu_grid),
        "mem_gb_per_gpu_grid": list(p.mem_gb_per_gpu_grid),
        "tput": [list(row) for row in p.tput],
    }


def unknown_workload(name: str = "my-cnn", like: str = "alexnet"):
    return workload_register(name=name, ground_truth=truth(like), workload_class="image")


def post(client, reports: list[dict]) -> dict:
    """One sync carrying `reports`; its answer."""
    return synced(client, reports=reports)


def point(run_id: str, cpus: int, seconds: float, seq: int | None = None) -> dict:
    return {
        "lease_id": run_id,
        "seq": seq if seq is not None else next(SEQ),
        "kind": "profile_point",
        "at": timezone.now().isoformat(),
        "data": {
            "cpus": cpus,
            "sec_per_iter": seconds,
            "wall_s": 1.5,
            "peak_rss_mb": 40.0,
            "mem_gbps": 12.0,
            "disk_mbps": 300.0,
        },
    }


def profile_commands(client, running: list[str] | None = None) -> list[dict]:
    """The profile commands of a sync that carries no reports."""
    return [c for c in synced(client, running=running or [])["commands"] if c["kind"] == "profile"]


def act_as_agent(client, model: str, *, max_syncs: int = 20) -> list[int]:
    """Sync as an agent measuring at `model`'s true speed, until the service stops asking: each sync
    carries the points the previous answer asked for, and its own answer (computed after they were
    applied) asks for the next ones, never for a point already measured."""
    p = load_catalog()[model]
    full = {c: p.iter_time_s / row[-1] for c, row in zip(p.cpu_per_gpu_grid, p.tput, strict=True)}
    measured: list[int] = []
    reports: list[dict] = []
    for _ in range(max_syncs):
        answer = post(client, reports)
        assert len(answer["acked"]) == len(reports) and not answer["rejected"]
        commands = [c for c in answer["commands"] if c["kind"] == "profile"]
        if not commands:
            return measured
        (command,) = commands
        assert not set(command["cpu_counts"]) & set(measured), (command, measured)
        asked = command["cpu_counts"]
        reports = [point(command["lease_id"], cpus, interpolate_seconds(full, cpus)) for cpus in asked]
        measured += asked
    raise AssertionError("the service kept asking for points")


def test_a_job_of_an_unprofiled_workload_waits_is_profiled_then_runs_with_its_profile(user):
    server = make_server("n1")
    client = agent_client(server)
    wl = unknown_workload()
    job = submit(user, workload=wl, name="mine")
    other = submit(user, gpus=8, name="eight")  # needs the whole server: the profiling GPU is taken

    sround = scheduling_round_run(trigger="test")
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.pending_reason == PendingReason.PROFILING
    assert JobEvent.objects.filter(job=job, kind="profiling").count() == 1
    assert not RoundDecision.objects.filter(round=sround, job=job).exists()
    run = ProfilingRun.objects.get(workload=wl)
    assert run.status == ProfilingRunStatus.RUNNING and run.server == server
    assert (len(run.gpu_indices), run.num_cpus, run.mem_gb) == (1, 24, 250.0)
    other.refresh_from_db()
    assert other.state == JobState.PENDING and other.pending_reason == PendingReason.RESOURCES

    (command,) = profile_commands(client)
    assert command["lease_id"] == str(run.lease_id) and command["cpu_counts"] == [24, 1]
    assert command["warmup"] is True and command["gpu_uuids"] == [f"GPU-n1-{run.gpu_indices[0]}"]
    assert command["argv"][:5] == ["python", "-m", "agent.workload", "--model", "my-cnn"]
    assert '"tput"' in command["env"]["ATTUNE_PROFILE_JSON"]  # the process runs at the true speed

    scheduling_round_run(trigger="test")  # a second round changes nothing while it runs
    job.refresh_from_db()
    assert job.pending_reason == PendingReason.PROFILING
    assert JobEvent.objects.filter(job=job, kind="profiling").count() == 1

    # A correction learnt for an earlier profile must not carry over to the new one.
    Workload.objects.filter(pk=wl.pk).update(speed_correction=0.5, speed_correction_jobs=3)
    measured = act_as_agent(client, "alexnet")
    run.refresh_from_db()
    wl.refresh_from_db()
    assert run.status == ProfilingRunStatus.SUCCEEDED, run.error
    assert (wl.speed_correction, wl.speed_correction_jobs) == (1.0, 0)
    assert len(run.measured_points) == len(measured) <= 9
    assert run.cost_gpu_s >= 0 and run.finished_at is not None and run.host["disk_mbps"] == 300.0
    assert wl.source.startswith("profiled on n1")
    catalog = load_catalog()["alexnet"]
    # No dataset was declared, so the memory columns are flat: the CPU axis is alexnet's, at full memory.
    for i, row in enumerate(wl.tput_matrix):
        assert relative_error(row[-1], catalog.tput[i][-1]) <= 0.03
    assert (wl.best_cpus_per_gpu, wl.speedup) == (12.0, pytest.approx(2.94, rel=0.03))
    assert wl.iter_time_s == pytest.approx(catalog.iter_time_s, rel=0.01)

    # Reports are idempotent: a retried point is acked and applied nothing.
    again = ProfilingReport.objects.filter(run=run).first()
    answer = post(client, [point(str(run.lease_id), 3, 99.0, seq=again.seq)])
    assert answer["acked"] == [[str(run.lease_id), again.seq]] and not answer["rejected"]
    run.refresh_from_db()
    assert len(run.measured_points) == len(measured)

    # GENIE's lightweight profile follows by itself (ATTUNE_GENIE_AFTER_SYNERGY, the default).
    genie = ProfilingRun.objects.get(workload=wl, kind=ProfilingKind.GENIE_PREDICTOR)
    assert genie.status == ProfilingRunStatus.QUEUED

    # The next round places the job with its measured profile: more than 3 cores per GPU; and starts
    # the GENIE run on two of the GPUs left.
    scheduling_round_run(trigger="test")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    allocation = lease_of(job)
    assert allocation.num_cpus > 3 and allocation.speedup > 1.0
    genie.refresh_from_db()
    assert genie.status == ProfilingRunStatus.RUNNING and len(genie.gpu_indices) == 2
    # The agent still lists the finished run: it is told to stop it (and to start GENIE's).
    kinds = {c["kind"]: c for c in synced(client, running=[run.lease_id])["commands"]}
    assert kinds["cancel"]["lease_id"] == str(run.lease_id)
    assert kinds["profile"]["lease_id"] == str(genie.lease_id) and kinds["profile"]["method"] == "genie"


def test_no_genie_profile_follows_when_settings_say_so_or_the_workload_has_a_fit(user, settings):
    settings.ATTUNE_GENIE_PROFILING = {**settings.ATTUNE_GENIE_PROFILING, "after_synergy": False}
    server = make_server("n1")
    wl = unknown_workload()
    submit(user, workload=wl)
    scheduling_round_run(trigger="test")
    act_as_agent(agent_client(server), "alexnet")
    assert not ProfilingRun.objects.filter(kind=ProfilingKind.GENIE_PREDICTOR).exists()
    settings.ATTUNE_GENIE_PROFILING = {**settings.ATTUNE_GENIE_PROFILING, "after_synergy": True}
    Workload.objects.filter(pk=wl.pk).update(genie_alpha_s=0.001, genie_beta_s=0.05)  # fitted before
    profiling_run_queue(workload=wl)
    scheduling_round_run(trigger="test")
    act_as_agent(agent_client(server), "alexnet")
    assert ProfilingRun.objects.filter(workload=wl, status=ProfilingRunStatus.SUCCEEDED).count() == 2
    assert not ProfilingRun.objects.filter(kind=ProfilingKind.GENIE_PREDICTOR).exists()


def test_a_failed_profile_leaves_the_job_at_the_proportional_share(user):
    server = make_server("n1")
    client = agent_client(server)
    wl = unknown_workload()
    job = submit(user, workload=wl, name="mine")
    scheduling_round_run(trigger="test")
    run = ProfilingRun.objects.get(workload=wl)
    error = {
        "lease_id": str(run.lease_id),
        "seq": 1,
        "kind": "profile_error",
        "at": timezone.now().isoformat(),
        "data": {"cpus": 24, "error": "the workload exited with 3", "exit_code": 3},
    }
    post(client, [error])
    run.refresh_from_db()
    assert run.status == ProfilingRunStatus.FAILED and "exited with 3" in run.error
    assert run.cost_gpu_s >= 0 and not profile_commands(client)

    scheduling_round_run(trigger="test")
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert lease_of(job).num_cpus == 3  # proportional: 24 cores / 8 GPUs
    assert ProfilingRun.objects.filter(workload=wl).count() == 1  # no automatic retry


def test_a_run_on_a_server_that_died_starts_over_elsewhere(user):
    n1 = make_server("n1")
    n2 = make_server("n2", cpus=12)
    wl = unknown_workload()
    submit(user, workload=wl, name="mine")
    scheduling_round_run(trigger="test")
    run = ProfilingRun.objects.get(workload=wl)
    assert run.server == n1  # the most free cores
    first_lease = run.lease_id
    post(agent_client(n1), [point(str(first_lease), 24, 0.2, seq=1)])
    n1.state = NodeState.DOWN
    n1.save(update_fields=["state"])
    scheduling_round_run(trigger="test")
    run.refresh_from_db()
    assert run.status == ProfilingRunStatus.RUNNING and run.server == n2 and run.num_cpus == 12
    assert run.pending_cpus == [12, 1] and not run.measured_points
    # A new lease id: the dead node's late reports are refused, the new node's seqs start afresh.
    assert run.lease_id != first_lease
    late = post(agent_client(n1), [point(str(first_lease), 1, 0.9, seq=2)])
    assert late["rejected"] and not late["acked"]
    answer = post(agent_client(n2), [point(str(run.lease_id), 12, 0.2, seq=1)])
    assert answer["acked"] == [[str(run.lease_id), 1]]
    run.refresh_from_db()
    assert [p["cpus"] for p in run.measured_points] == [12]


def test_the_task_dispatches_a_queued_run(user):
    make_server("n1", gpus=2, cpus=6, mem_gb=100.0)
    run = profiling_run_queue(workload=unknown_workload())
    assert workload_profile_task.apply(args=[run.pk]).get() == ProfilingRunStatus.RUNNING
    run.refresh_from_db()
    assert (run.num_cpus, run.mem_gb, run.pending_cpus) == (6, 100.0, [6, 1])
    assert workload_profile_task.apply(args=[run.pk]).get() == ProfilingRunStatus.RUNNING  # idempotent


def test_a_run_waits_when_no_server_has_room(user):
    make_server("n1", gpus=1)
    submit(user, name="busy")  # takes the only GPU
    scheduling_round_run(trigger="test")
    wl = unknown_workload()
    job = submit(user, workload=wl, name="mine")
    scheduling_round_run(trigger="test")
    run = ProfilingRun.objects.get(workload=wl)
    assert run.status == ProfilingRunStatus.QUEUED
    job.refresh_from_db()
    assert job.pending_reason == PendingReason.PROFILING


def test_progress_reports_record_predicted_versus_measured_speed(user):
    server = make_server("n1")
    client = agent_client(server)
    job = submit(user, name="res18")
    scheduling_round_run(trigger="test")
    allocation = lease_of(job)
    lease = str(allocation.lease_id)
    now = timezone.now()
    reports = [
        {"lease_id": lease, "seq": 1, "kind": "started", "at": now.isoformat(), "data": {}},
        {
            "lease_id": lease,
            "seq": 2,
            "kind": "progress",
            "at": (now + timedelta(seconds=3)).isoformat(),
            "data": {"done_iters": 100, "iters_per_s": 150.0, "time_scale": 0.01},
        },
        {
            "lease_id": lease,
            "seq": 3,
            "kind": "progress",
            "at": (now + timedelta(seconds=6)).isoformat(),
            "data": {"done_iters": 200, "iters_per_s": 160.0, "time_scale": 0.01},
        },
    ]
    post(client, reports)
    obs = SpeedObservation.objects.get(allocation=allocation)
    assert obs.workload == job.workload and obs.job_id == job.pk and obs.samples == 2
    assert obs.predicted_iters_per_s == pytest.approx(allocation.speedup / job.workload.iter_time_s)
    assert obs.measured_iters_per_s == pytest.approx(1.6)  # in the workload's own time
    assert obs.cpus_per_gpu == allocation.num_cpus


def test_profile_workload_command_registers_and_queues(user):
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command(
        "profile_workload", "torch-cnn", "--register", "--argv", "python -m agent.torch_workload", stdout=out
    )
    run = ProfilingRun.objects.get(workload__name="torch-cnn")
    assert run.status == ProfilingRunStatus.QUEUED and f"run {run.pk}" in out.getvalue()
    assert run.workload.argv == ["python", "-m", "agent.torch_workload"] and not run.workload.tput_matrix
    with pytest.raises(CommandError, match="already has"):
        call_command("profile_workload", "torch-cnn", stdout=StringIO())
    with pytest.raises(CommandError, match="no workload"):
        call_command("profile_workload", "nope", stdout=StringIO())
    # The profile command runs the workload's own argv, with the iterations appended.
    make_server("n1")
    job = submit(user, workload=run.workload, name="t")
    scheduling_round_run(trigger="test")
    run.refresh_from_db()
    assert run.status == ProfilingRunStatus.RUNNING
    (command,) = profile_commands(agent_client(run.server))
    assert command["argv"] == ["python", "-m", "agent.torch_workload", "--iters", "55"]
    job.refresh_from_db()
    assert job.pending_reason == PendingReason.PROFILING
