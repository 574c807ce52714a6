"""GENIE's interference learnt online: communicating jobs measured slower next to each other teach the
workload's kappa, which the next round's speeds then carry (through real rounds and agent syncs)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from profiles_app.models import SpeedObservation, Workload
from profiles_app.selectors import workload_iter_time_s, workload_profile
from scheduler_app.core.predictor import KAPPA_MIN_LEASES
from scheduler_app.models import Job, JobState
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, agent_client, make_server, submit, synced

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

KAPPA = 0.5  # what each communicating neighbour really costs this workload, as the agents will measure


def run_together(jobs: list[Job], server) -> list:
    """Place `jobs` in one real round on `server`, let its agent report each lease's progress at the
    speed GENIE's model gives it next to the others (x = the other communicating jobs there), then
    each job's exit. Returns the leases."""
    scheduling_round_run()
    leases = [lease for job in jobs for lease in active(job)]
    assert len(leases) == len(jobs) and all(lease.server_id == server.pk for lease in leases)
    t0 = timezone.now()
    client = agent_client(server)
    for job, lease in zip(jobs, leases, strict=True):
        workload = job.workload
        # The lease's speed-up holds the interference its round predicted; the agent measures the truth.
        predicted_factor = 1.0 + workload.interference_kappa * lease.colocated_comm_jobs
        alone_ips = lease.speedup * predicted_factor / workload_iter_time_s(workload, job.num_gpus)
        truth = 1.0 + KAPPA * lease.colocated_comm_jobs if job.num_gpus > 1 else 1.0  # 1 GPU: no all-reduce
        measured_ips = alone_ips / truth

        def report(seq: int, kind: str, lease=lease, **data) -> dict:
            at = (t0 + timedelta(seconds=10 * seq)).isoformat()
            return {"lease_id": str(lease.lease_id), "seq": seq, "kind": kind, "at": at, "data": data}

        reports = [report(1, "started", pid=1)] + [
            report(1 + n, "progress", done_iters=10 * n, iters_per_s=measured_ips) for n in range(1, 4)
        ]
        synced(client, running=[lease.lease_id], reports=reports)
    for job, lease in zip(jobs, leases, strict=True):
        exit_report = {
            "lease_id": str(lease.lease_id),
            "seq": 5,
            "kind": "exited",
            "at": (t0 + timedelta(seconds=50)).isoformat(),
            "data": {"exit_code": 0, "done_iters": job.total_iters},
        }
        synced(client, reports=[exit_report])
        job.refresh_from_db()
        assert job.state == JobState.COMPLETED
    return leases


def kappa() -> tuple[float, int]:
    w = Workload.objects.get(name="res18")
    return w.interference_kappa, w.interference_kappa_leases


def test_co_located_communicating_leases_teach_kappa_which_the_next_round_applies(user):
    server = make_server("gpu01", gpus=8, cpus=24, mem_gb=500)
    for _ in range(KAPPA_MIN_LEASES):
        (alone,) = run_together([submit(user, gpus=2, iters=1000)], server)
        assert alone.colocated_comm_jobs == 0
    assert kappa() == (0.0, 0)  # leases alone say nothing about interference
    pair = run_together([submit(user, gpus=2, iters=1000, name=f"p{i}") for i in range(2)], server)
    assert [lease.colocated_comm_jobs for lease in pair] == [1, 1]
    assert pair[0].speedup == pytest.approx(alone.speedup)  # nothing learnt: co-location looks free
    # A 1-GPU job beside them does not communicate: its leases teach nothing, and it is not slowed.
    trio = run_together(
        [submit(user, gpus=g, iters=1000, name=f"t{i}") for i, g in enumerate((2, 2, 1))], server
    )
    assert [lease.colocated_comm_jobs for lease in trio] == [1, 1, 2]
    learnt, leases = kappa()
    assert learnt == pytest.approx(KAPPA) and leases == KAPPA_MIN_LEASES + 4
    assert workload_profile(Workload.objects.get(name="res18")).interference_kappa == pytest.approx(KAPPA)
    stored = SpeedObservation.objects.filter(job__num_gpus=2, colocated_comm_jobs=1)
    assert set(stored.values_list("interference_factor", flat=True)) == {1.0}  # as predicted then

    # The next round predicts two communicating jobs side by side (1 + kappa) times slower, a third
    # job of one GPU not at all; their measured leases match, so kappa stays put.
    trio = run_together(
        [submit(user, gpus=g, iters=1000, name=f"u{i}") for i, g in enumerate((2, 2, 1))], server
    )
    assert alone.speedup == pytest.approx(1.0)  # the proportional share
    assert [lease.speedup for lease in trio] == pytest.approx([1 / (1 + KAPPA), 1 / (1 + KAPPA), 1.0])
    assert kappa()[0] == pytest.approx(KAPPA)
