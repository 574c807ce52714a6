"""The `__any` lookup (cluster_app/lookups.py): the rows `__in` finds, as one array parameter (PostgreSQL)."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cluster_app.models import Server
from scheduler_app.models import Allocation
from tests.api.helpers import lease_of, make_server, submit


@pytest.mark.django_db
@pytest.mark.parametrize("which", ["none", "unknown", "some", "all", "all and unknown"])
def test_any_finds_what_in_finds(which):
    servers = [make_server(f"gpu{i:02d}", gpus=1) for i in range(5)]
    ids = [s.pk for s in servers]
    unknown = max(ids) + 99
    values = {
        "none": [],
        "unknown": [unknown],
        "some": ids[1:4:2],
        "all": ids,
        "all and unknown": [*ids, unknown],
    }[which]
    with CaptureQueriesContext(connection) as queries:
        found = set(Server.objects.filter(pk__any=values).values_list("pk", flat=True))
    assert found == set(Server.objects.filter(pk__in=values).values_list("pk", flat=True))
    if connection.vendor == "postgresql":
        assert "= ANY(" in queries[0]["sql"]


@pytest.mark.django_db
def test_any_prepares_values_for_their_field(user, settings):
    """UUIDs given as strings match, as they do with `__in`."""
    from scheduler_app.services.rounds import scheduling_round_run

    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False}
    make_server("gpu01", gpus=2)
    job = submit(user, gpus=1)
    scheduling_round_run()
    lease = lease_of(job)
    assert list(Allocation.objects.filter(lease_id__any=[str(lease.lease_id), str(uuid.uuid4())])) == [lease]
    # On a foreign key, by the related row's id.
    assert list(Allocation.objects.filter(job_id__any=[job.pk]).values_list("pk", flat=True)) == [lease.pk]
    assert list(Allocation.objects.filter(job__any=[job.pk]).values_list("pk", flat=True)) == [lease.pk]
