"""Database constraints of the work tables: no double-booked GPU, valid jobs, append-only history."""

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from scheduler_app.models import AllocationGpu, Job, JobEvent
from tests.factories import AllocationFactory, JobFactory, ServerFactory, UserFactory, hold_gpus

pytestmark = pytest.mark.django_db


def test_a_gpu_cannot_be_in_two_active_allocations():
    server = ServerFactory()
    gpu = server.gpus.get(index=0)
    hold_gpus(AllocationFactory(server=server), gpu)
    second = AllocationFactory(server=server)
    with pytest.raises(IntegrityError) as excinfo, transaction.atomic():
        hold_gpus(second, gpu)
    # PostgreSQL names the partial unique index; SQLite names the column it covers.
    expected = "gpu_in_one_active_allocation" if connection.vendor == "postgresql" else "gpu_id"
    assert expected in str(excinfo.value)


def test_a_released_gpu_can_be_allocated_again():
    server = ServerFactory()
    gpu = server.gpus.get(index=0)
    (hold,) = hold_gpus(AllocationFactory(server=server), gpu)
    AllocationGpu.objects.filter(pk=hold.pk).update(released_at=timezone.now())
    hold_gpus(AllocationFactory(server=server), gpu)
    assert AllocationGpu.objects.filter(gpu=gpu, released_at__isnull=True).count() == 1


def test_two_gpus_of_one_server_in_two_allocations_is_fine():
    server = ServerFactory()
    hold_gpus(AllocationFactory(server=server), server.gpus.get(index=0))
    hold_gpus(AllocationFactory(server=server), server.gpus.get(index=1))
    assert AllocationGpu.objects.filter(released_at__isnull=True).count() == 2


@pytest.mark.parametrize(
    "fields",
    [
        {"num_gpus": 0},
        {"total_iters": 0},
        {"done_iters": -1},
        {"cpus_per_gpu": 0.0},
        {"mem_gb_per_gpu": -2.0},
        {"qos_max_latency_s": 0.0},
        {"qos_max_latency_s": 60.0, "qos_deadline_at": timezone.now()},
        {"workload": None, "command": ""},
    ],
    ids=lambda f: ",".join(f),
)
def test_job_constraints_reject_invalid_rows(fields):
    with pytest.raises(IntegrityError), transaction.atomic():
        JobFactory(**fields)


def test_job_with_own_command_and_no_workload_is_valid():
    job = JobFactory(workload=None, command="python train.py")
    assert Job.objects.filter(pk=job.pk, workload__isnull=True).exists()


def test_allocation_needs_cpus_and_memory():
    with pytest.raises(IntegrityError), transaction.atomic():
        AllocationFactory(num_cpus=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        AllocationFactory(mem_gb=0)


def test_job_history_cannot_be_deleted_with_its_job():
    job = JobFactory(owner=UserFactory())
    JobEvent.objects.create(job=job, kind="submitted")
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        job.delete()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the append-only trigger is PostgreSQL's")
def test_postgres_refuses_to_update_or_delete_job_events():
    event = JobEvent.objects.create(job=JobFactory(), kind="submitted")
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        JobEvent.objects.filter(pk=event.pk).update(kind="tampered")
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        JobEvent.objects.filter(pk=event.pk).delete()
    assert JobEvent.objects.get(pk=event.pk).kind == "submitted"
