"""factory_boy factories for the Django models (core and simulator tests use tests/builders.py)."""

import functools
from datetime import datetime

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.db.models import F
from django.utils import timezone

from cluster_app.models import Gpu, Server, ServerHeartbeat
from profiles_app.catalog import profile_for
from profiles_app.models import Workload
from scheduler_app.models import Allocation, AllocationGpu, Job, Team


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    # Hashed once per password and shared by every user made with it: Django's PBKDF2 (1,000,000
    # iterations) took 0.5 s to 2.5 s a user on a 2-core machine, minutes of the suite. The hash is
    # still the production hasher's, so a login checks the password for real.
    password = factory.django.Password("pw-for-tests", transform=functools.cache(make_password))


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team

    name = factory.Sequence(lambda n: f"team{n}")


class ServerFactory(factory.django.DjangoModelFactory):
    """A server with `num_gpus` GPU rows (indices 0..n-1, unique UUIDs)."""

    class Meta:
        model = Server
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"node{n:03d}")
    num_gpus = 8
    num_cpus = 24
    mem_gb = 500.0
    gpu_model = "Tesla V100"
    registered_at = factory.LazyFunction(timezone.now)  # its agent registered (None: never)

    @factory.post_generation
    def last_heartbeat_at(self, create: bool, extracted, **kwargs) -> None:
        """`ServerFactory(last_heartbeat_at=t)`: its agent was last heard from at t."""
        if create and extracted is not None:
            heartbeat_at(self, extracted)

    @factory.post_generation
    def with_gpus(self, create: bool, extracted, **kwargs) -> None:
        if create and extracted is not False:
            Gpu.objects.bulk_create(
                Gpu(server=self, index=i, uuid=f"GPU-{self.name}-{i}", model=self.gpu_model)
                for i in range(self.num_gpus)
            )


def heartbeat_at(server: Server, at: datetime | None) -> None:
    """Set when `server`'s agent was last heard from (None: never)."""
    ServerHeartbeat.objects.filter(server_id=server.pk).delete()
    if at is not None:
        ServerHeartbeat.objects.create(server_id=server.pk, at=at)


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    server = factory.SubFactory(ServerFactory, with_gpus=False)
    index = factory.Sequence(lambda n: n)
    uuid = factory.Sequence(lambda n: f"GPU-factory-{n}")


class WorkloadFactory(factory.django.DjangoModelFactory):
    """A catalog workload with res18's real profile unless told otherwise."""

    class Meta:
        model = Workload
        django_get_or_create = ("name",)

    name = "res18"
    workload_class = "image"
    iter_time_s = factory.LazyAttribute(lambda o: profile_for("res18").iter_time_s)
    cpu_per_gpu_grid = factory.LazyFunction(lambda: list(profile_for("res18").cpu_per_gpu_grid))
    mem_gb_per_gpu_grid = factory.LazyFunction(lambda: list(profile_for("res18").mem_gb_per_gpu_grid))
    tput_matrix = factory.LazyFunction(lambda: [list(r) for r in profile_for("res18").tput])
    best_cpus_per_gpu = 9.0
    best_mem_gb_per_gpu = 62.5
    speedup = 2.4


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"job{n}")
    workload = factory.SubFactory(WorkloadFactory)
    num_gpus = 1
    total_iters = 1000


class AllocationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Allocation

    job = factory.SubFactory(JobFactory)
    server = factory.SubFactory(ServerFactory)
    num_gpus = 0  # hold_gpus counts the GPUs it attaches
    num_cpus = 3
    mem_gb = 62.5


def hold_gpus(allocation: Allocation, *gpus: Gpu) -> list[AllocationGpu]:
    """Attach GPUs to an allocation, one INSERT each (so the database checks every row), and count them
    in its num_gpus as a round does."""
    holds = [AllocationGpu.objects.create(allocation=allocation, gpu=g) for g in gpus]
    Allocation.objects.filter(pk=allocation.pk).update(num_gpus=F("num_gpus") + len(holds))
    allocation.refresh_from_db(fields=["num_gpus"])
    return holds
