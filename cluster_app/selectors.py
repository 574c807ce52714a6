"""Every read of the hardware tables."""

from collections.abc import Iterable
from datetime import UTC, datetime

from django.db import connection
from django.db.models import Count, Max, QuerySet, Sum
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from cluster_app.models import AgentCredential, Gpu, NodeState, Server
from cluster_app.tokens import agent_token_digest
from infra.raw_rows import model_rows

# States in which a server takes new work. DRAINING servers keep their running leases but get
# nothing new; NOT_RESPONDING and DOWN servers get nothing at all.
SCHEDULABLE_STATES = frozenset({NodeState.IDLE, NodeState.MIXED, NodeState.ALLOCATED})


def server_takes_work(server: Server) -> bool:
    """Whether new work may be placed on `server`: its agent registered (the GPUs are real, not
    node_token's placeholders) and its state is schedulable."""
    return server.state in SCHEDULABLE_STATES and server.registered_at is not None


def servers_taking_work() -> QuerySet[Server]:
    """The servers that `server_takes_work` admits, as a query."""
    return Server.objects.filter(state__in=SCHEDULABLE_STATES, registered_at__isnull=False)


def server_list() -> QuerySet[Server]:
    return Server.objects.select_related("heartbeat").order_by("name")


def server_get_by_name(*, name: str) -> Server | None:
    return Server.objects.filter(name=name).first()


def servers_lock_all() -> list[Server]:
    """Every server, locked FOR NO KEY UPDATE in id order; call inside a transaction.

    Lock order, shared by every writer that touches both servers and jobs (the round, the liveness
    sweep): all server rows first, then job rows, each in id order. Taking the same order everywhere
    is what keeps those writers from deadlocking each other.

    NO KEY: a transaction that holds a job and updates one of its leases twice (applying an exit
    report) has PostgreSQL re-check the lease's foreign keys at COMMIT, with FOR KEY SHARE on its
    server. FOR UPDATE would make that COMMIT wait for the round while the round waits for the job:
    a deadlock (tests/faults/test_round_lock_order.py). Every write to a server row still waits.
    """
    return list(Server.objects.select_for_update(no_key=True).order_by("id"))


def server_lock(*, server: Server) -> Server:
    """The server's row, re-read and locked FOR UPDATE; call inside a transaction."""
    return Server.objects.select_for_update().get(pk=server.pk)


def server_ids_in_states(*, states: Iterable[str]) -> list[int]:
    return list(Server.objects.filter(state__in=list(states)).values_list("id", flat=True))


def server_ids_silent_since(*, server_ids: Iterable[int], since: datetime) -> list[int]:
    """Those of `server_ids` not heard from since `since` (last heartbeat before it, or none ever)."""
    ids = list(server_ids)
    if not ids:
        return []
    heard = set(Server.objects.filter(pk__in=ids, heartbeat__at__gte=since).values_list("id", flat=True))
    return [pk for pk in ids if pk not in heard]


def gpus_active(*, server_ids: Iterable[int] | None = None) -> list[tuple[int, int, int, str]]:
    """(gpu id, server id, index, uuid) of every non-retired GPU, by server then index."""
    qs = Gpu.objects.filter(retired_at__isnull=True)
    if server_ids is not None:
        qs = qs.filter(server_id__any=list(server_ids))  # a round passes every server: one array
    return list(qs.order_by("server_id", "index").values_list("id", "server_id", "index", "uuid"))


def agent_credential_find(*, token: str) -> AgentCredential | None:
    """The live (not revoked) credential for `token`, with its server, or None.

    Hand-written: every agent call asks it, and the ORM builds the same join for about a millisecond
    of CPU, several times what running it costs. The credential carries what its uses need (its id,
    its server, its last use, for the throttled touch).
    """
    qn = connection.ops.quote_name
    credentials, servers = qn(AgentCredential._meta.db_table), qn(Server._meta.db_table)
    sql = (
        f"SELECT s.*, c.id AS credential_pk, c.last_used_at AS credential_last_used_at"
        f" FROM {credentials} c JOIN {servers} s ON s.id = c.server_id"
        f" WHERE c.token_digest = %s AND c.revoked_at IS NULL"
    )
    for server in model_rows(Server, sql, [agent_token_digest(token)]):
        last_used_at = server.__dict__.pop("credential_last_used_at")
        # An extra column skips the model field's conversion: SQLite hands back a naive UTC time.
        if isinstance(last_used_at, str):
            last_used_at = parse_datetime(last_used_at)
        if last_used_at is not None and timezone.is_naive(last_used_at):
            last_used_at = last_used_at.replace(tzinfo=UTC)
        return AgentCredential(
            pk=server.__dict__.pop("credential_pk"), server=server, last_used_at=last_used_at
        )
    return None


def cluster_capacity() -> dict[str, float]:
    """Totals over all servers: servers, GPUs, CPU cores, memory GB; and the most GPUs one server has."""
    totals = Server.objects.aggregate(
        servers=Count("id"),
        gpus=Sum("num_gpus"),
        cpus=Sum("num_cpus"),
        mem_gb=Sum("mem_gb"),
        largest_server_gpus=Max("num_gpus"),
    )
    return {k: (v or 0) for k, v in totals.items()}


def server_shapes() -> list[tuple[str, int, int, float]]:
    """(name, GPUs, CPU cores, memory GB) of every server, by name: what one job's share could be."""
    return list(Server.objects.order_by("name").values_list("name", "num_gpus", "num_cpus", "mem_gb"))
