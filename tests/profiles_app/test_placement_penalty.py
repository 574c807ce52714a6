"""GENIE's cross-node cost learnt online: spread leases measured slower than one-server leases raise the
workload's placement penalty, which the next round's allocation then carries."""

from datetime import timedelta

import pytest
from django.utils import timezone

from profiles_app.models import SpeedObservation, Workload
from profiles_app.selectors import workload_profile
from profiles_app.services.refits import placement_penalty_refit
from profiles_app.services.speeds import SPEED_MIN_REPORTS
from profiles_app.services.workloads import workload_catalog_load
from scheduler_app.core.predictor import PENALTY_MIN_LEASES
from scheduler_app.models import Job, JobState
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, agent_client, make_server, submit, synced
from tests.factories import AllocationFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

SLOWER_SPREAD = 1.5  # what spreading really costs this workload, as the agents will measure it


@pytest.fixture
def servers():
    return [make_server(name, gpus=4, cpus=12, mem_gb=250) for name in ("gpu01", "gpu02")]


def run_to_completion(job: Job, servers, *, slowdown: float) -> list:
    """Place `job` in a real round, let every agent holding a lease report progress at the predicted
    speed divided by `slowdown` (undoing any penalty the prediction already holds), then the exit.
    Returns the job's leases, one per server it spanned."""
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    leases = active(job)
    t0 = timezone.now()
    by_server = {s.pk: s for s in servers}
    for lease in leases:
        spread = len(leases) > 1
        penalty = job.workload.placement_penalty if spread else 1.0
        unpenalised_ips = lease.speedup * penalty / job.workload.iter_time_s

        def report(seq: int, kind: str, lease=lease, **data) -> dict:
            at = (t0 + timedelta(seconds=10 * seq)).isoformat()
            return {"lease_id": str(lease.lease_id), "seq": seq, "kind": kind, "at": at, "data": data}

        reports = [report(1, "started", pid=1)] + [
            report(1 + n, "progress", done_iters=10 * n, iters_per_s=unpenalised_ips / slowdown)
            for n in range(1, SPEED_MIN_REPORTS + 1)
        ]
        if lease.pk == min(x.pk for x in leases):  # the job ends with its rank 0 (gang semantics)...
            exit_report = (
                lease,
                report(SPEED_MIN_REPORTS + 2, "exited", exit_code=0, done_iters=job.total_iters),
            )
        answer = synced(agent_client(by_server[lease.server_id]), running=[lease.lease_id], reports=reports)
        assert len(answer["acked"]) == len(reports)
    lease, last = exit_report  # ... once every part has reported its speed
    synced(agent_client(by_server[lease.server_id]), reports=[last])
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED
    return leases


def penalty(name: str = "res18") -> tuple[float, int]:
    w = Workload.objects.get(name=name)
    return w.placement_penalty, w.placement_penalty_leases


def test_spread_leases_measured_slower_teach_the_penalty_the_next_round_applies(user, servers):
    for _ in range(PENALTY_MIN_LEASES):
        (alone,) = run_to_completion(submit(user, gpus=1, iters=1000), servers, slowdown=1.0)
    assert penalty() == (1.0, 0)  # one-server leases alone say nothing about spreading
    wide = run_to_completion(submit(user, gpus=8, iters=1000), servers, slowdown=SLOWER_SPREAD)
    assert len(wide) == 2 and penalty() == (1.0, 0)  # 2 spread leases: one short of a fit
    assert wide[0].speedup == pytest.approx(alone.speedup)  # nothing learnt: spreading looks free
    run_to_completion(submit(user, gpus=8, iters=1000), servers, slowdown=SLOWER_SPREAD)
    learnt, leases = penalty()
    assert learnt == pytest.approx(SLOWER_SPREAD) and leases == PENALTY_MIN_LEASES + 4
    spread = SpeedObservation.objects.filter(num_servers=2)
    assert spread.count() == 4 and set(spread.values_list("placement_penalty", flat=True)) == {1.0}
    assert workload_profile(Workload.objects.get(name="res18")).placement_penalty == pytest.approx(1.5)

    # The live round now predicts a spread job at its learnt speed, and its measured leases are
    # compared with that penalised prediction; the fit takes the penalty out again and stays put.
    wide = run_to_completion(submit(user, gpus=8, iters=1000), servers, slowdown=SLOWER_SPREAD)
    assert wide[0].speedup == pytest.approx(alone.speedup / SLOWER_SPREAD)
    assert sorted(spread.values_list("placement_penalty", flat=True)) == pytest.approx([1, 1, 1, 1, 1.5, 1.5])
    assert penalty() == (pytest.approx(SLOWER_SPREAD), PENALTY_MIN_LEASES + 6)


def test_the_fit_reads_only_leases_measured_often_enough(user, servers):
    job = submit(user, gpus=1)
    now = timezone.now()
    for i in range(2 * PENALTY_MIN_LEASES):
        spread = i % 2 == 1
        SpeedObservation.objects.create(
            workload=job.workload,
            job=job,
            allocation=AllocationFactory(job=job, server=servers[0]),
            cpus_per_gpu=3,
            mem_gb_per_gpu=62.5,
            num_servers=2 if spread else 1,
            predicted_iters_per_s=1.0,
            measured_iters_per_s=0.5 if spread else 1.0,
            samples=SPEED_MIN_REPORTS - 1,  # start-up only: no lease counts
            first_at=now,
            at=now,
        )
    assert placement_penalty_refit(workload_id=job.workload_id) is None
    assert penalty() == (1.0, 0)
    SpeedObservation.objects.update(samples=SPEED_MIN_REPORTS)
    assert placement_penalty_refit(workload_id=job.workload_id) == pytest.approx(2.0)


def test_a_catalog_reload_keeps_a_learnt_penalty_and_updates_a_shipped_one():
    workload_catalog_load()
    Workload.objects.filter(name="res18").update(placement_penalty=1.8, placement_penalty_leases=12)
    Workload.objects.filter(name="lstm").update(placement_penalty=3.0)  # shipped, say, by an older release
    workload_catalog_load()
    assert penalty("res18") == (1.8, 12)
    assert penalty("lstm") == (1.0, 0)
