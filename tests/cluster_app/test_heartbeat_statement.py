"""A live server's heartbeat on PostgreSQL is one statement: committed alone, never waiting for a round."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from cluster_app.models import ClusterUsageMinute, GpuUsageSample, Server, ServerHeartbeat, UsageSample
from cluster_app.selectors import servers_lock_all
from cluster_app.services import node_heartbeat
from tests.cluster_app.test_usage_minutes import report
from tests.factories import ServerFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("the one-statement heartbeat is PostgreSQL's; SQLite takes the steps one by one")


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def test_outside_a_transaction_it_commits_by_itself_and_leaves_the_session_as_it_was():
    server = ServerFactory(name="a", num_gpus=2, num_cpus=24, mem_gb=500)
    before = _synchronous_commit()
    at = timezone.now().replace(microsecond=0)
    returned = node_heartbeat(server=server, usage=report(server, at, 50, 250, [100, 50]), now=at)
    assert returned.last_heartbeat_at == at
    assert _synchronous_commit() == before  # set for its own commit only (set_config's is_local)
    # Seen from another connection: committed, nothing left open on this one.
    assert not connection.in_atomic_block
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {GpuUsageSample._meta.db_table}")
            assert cursor.fetchone()[0] == 2
    finally:
        other.close()
    minute = ClusterUsageMinute.objects.get()
    assert (minute.servers_sampled, minute.cpu_cores_sum, minute.gpu_samples) == (1, 24, 2)
    assert (minute.cpu_util_pct_cores_sum, minute.mem_capacity_gb_sum, minute.gpu_util_pct_sum) == (
        pytest.approx(50 * 24),
        pytest.approx(500),
        pytest.approx(150),
    )
    # The same beat again: stored once, nothing added.
    node_heartbeat(server=server, usage=report(server, at, 50, 250, [100, 50]), now=at)
    assert UsageSample.objects.count() == 1 and GpuUsageSample.objects.count() == 2
    assert ClusterUsageMinute.objects.get().servers_sampled == 1


def test_while_a_round_holds_the_server_row_it_stores_the_sample_and_the_heartbeat_without_waiting():
    # The server row is left alone: the time goes to ServerHeartbeat, which no round locks. Before,
    # the touch skipped a locked row, and servers whose beats kept landing in rounds went
    # NOT_RESPONDING under a fleet's load.
    server = ServerFactory(name="held", num_gpus=1)
    assert Server.objects.get(pk=server.pk).last_heartbeat_at is None
    locked, release = threading.Event(), threading.Event()

    def round_holding_the_row():
        try:
            with transaction.atomic():
                servers_lock_all()  # as a round takes them: FOR NO KEY UPDATE
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=round_holding_the_row)
    holder.start()
    try:
        assert locked.wait(10)
        at = timezone.now()
        started = timezone.now()
        returned = node_heartbeat(server=server, usage=report(server, at, 10, 1, [5]), now=at)
        assert timezone.now() - started < timedelta(seconds=5)  # did not wait for the round
        assert returned.last_heartbeat_at == at
        assert UsageSample.objects.filter(server=server).count() == 1
        assert ServerHeartbeat.objects.get(server=server).at == at  # committed while the round holds on
    finally:
        release.set()
        holder.join(30)
    earlier = at - timedelta(seconds=30)
    node_heartbeat(server=server, usage=report(server, earlier, 10, 1, [5]), now=earlier)
    assert Server.objects.get(pk=server.pk).last_heartbeat_at == at  # never moved back
