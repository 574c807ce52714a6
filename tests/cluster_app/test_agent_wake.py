"""Waking agents between syncs: the per-server generation in Redis bumped and published after commit by
what changes a server's commands (cluster_app/agent_wake.py), the signed wait tickets, and the
long-poll itself (config/agent_wait.py) served by config/asgi.py's application under a real uvicorn
server, beside Django. Needs a Redis at REDIS_URL (skipped otherwise)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.core import signing
from django.db import connection

from cluster_app import agent_wake
from cluster_app.agent_wake import (
    AGENT_WAIT_PATH,
    GENERATION_KEY,
    TICKET_SALT,
    WAKE_CHANNEL,
    agents_wake,
    agents_wake_on_commit,
    wait_ticket,
    wait_ticket_server,
    wake_generation,
    wake_message,
    wake_message_parse,
    wake_spacing_s,
)
from cluster_app.services import agent_credential_issue
from config import agent_wait
from scheduler_app.models import JobState
from scheduler_app.services.job_control import job_cancel
from scheduler_app.services.nodes import node_drain
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import SYNC, lease_of, make_server, submit, usage_sample
from tests.asgi_server import uvicorn_serving


def _redis_up() -> bool:
    try:
        return bool(redis.Redis.from_url(django_settings.REDIS_URL, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def wake(settings) -> redis.Redis:
    """Waking on, against the real Redis at REDIS_URL."""
    if not _redis_up():
        pytest.skip(f"Redis is not reachable at {django_settings.REDIS_URL}")
    settings.ATTUNE_AGENT_WAKE = True
    return redis.Redis.from_url(settings.REDIS_URL)


def generation(r: redis.Redis, server_id: int) -> int:
    return int(r.get(GENERATION_KEY.format(server_id=server_id)) or 0)


@pytest.fixture
def published(wake) -> Iterator[Callable[[], list[set[int]]]]:
    """Subscribed to the wake channel; calling it returns the server-id sets published since (the
    channel is Redis-wide: another test session's messages may be there too)."""
    pubsub = wake.pubsub()
    pubsub.subscribe(WAKE_CHANNEL)
    confirmed = pubsub.get_message(timeout=2)
    assert confirmed is not None and confirmed["type"] == "subscribe"

    def read() -> list[set[int]]:
        got, deadline = [], time.monotonic() + 1.0
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.1)
            if message is None:
                if got:
                    break
                continue
            if message["type"] == "message":
                got.append(set(wake_message_parse(message["data"])[1]))
        return got

    yield read
    pubsub.close()


@pytest.fixture
def rounds(settings, monkeypatch):
    """Rounds run by the tests; the early rounds they ask for after commit are dropped (no Celery)."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
    }
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request", lambda *, trigger: None
    )
    monkeypatch.setattr("notify_app.services.events.notifications_dispatch", lambda *, notification_ids: None)
    monkeypatch.setattr("scheduler_app.services.admission.admission_forecast_request", lambda: None)
    monkeypatch.setattr("scheduler_app.services.admission_worker.admission_forecast_request", lambda: None)


def wake_callbacks(callbacks) -> list:
    """The captured on-commit callbacks that wake agents (the others ask for rounds, notify...)."""
    return [cb for cb in callbacks if cb.__module__ == agent_wake.__name__]


# --- (d) generations bumped after commit ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_round_that_places_a_job_wakes_that_servers_agent_after_commit(
    wake, published, rounds, user, django_capture_on_commit_callbacks
):
    servers = [
        make_server("gpu01", gpus=4, cpus=12, mem_gb=250),
        make_server("gpu02", gpus=4, cpus=12, mem_gb=250),
    ]
    job = submit(user, gpus=2)
    before = {s.pk: generation(wake, s.pk) for s in servers}
    with django_capture_on_commit_callbacks() as callbacks:
        scheduling_round_run()
    placed_on = lease_of(job).server_id
    (other,) = [s.pk for s in servers if s.pk != placed_on]
    # Nothing before the commit: an agent woken now would sync and not see the lease yet.
    assert {s.pk: generation(wake, s.pk) for s in servers} == before
    # One Redis round trip for the round's leases.
    assert [cb.__name__ for cb in wake_callbacks(callbacks)] == ["<lambda>"]
    for cb in wake_callbacks(callbacks):
        cb()
    assert generation(wake, placed_on) == before[placed_on] + 1
    assert generation(wake, other) == before[other]
    assert {placed_on} in published()


@pytest.mark.django_db
def test_cancelling_a_running_job_wakes_its_servers_agent(
    wake, published, rounds, user, django_capture_on_commit_callbacks
):
    server = make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    job = submit(user, gpus=2)
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    before = generation(wake, server.pk)
    with django_capture_on_commit_callbacks() as callbacks:
        job_cancel(job=job, by=user)
    assert generation(wake, server.pk) == before
    for cb in wake_callbacks(callbacks):
        cb()
    assert generation(wake, server.pk) == before + 1
    assert {server.pk} in published()


@pytest.mark.django_db
def test_the_exit_of_a_moved_jobs_old_process_wakes_the_agent_of_its_next_lease(
    wake, published, django_capture_on_commit_callbacks
):
    """A moved job's next lease is not started until its old process exited (agent_commands): the
    exit's arrival wakes the next lease's agent, which would otherwise wait for its next sync."""
    from datetime import timedelta

    from django.utils import timezone

    from scheduler_app.services.report_apply import LeaseReport
    from scheduler_app.services.report_ingest import agent_reports_ingest
    from tests.factories import AllocationFactory, JobFactory, ServerFactory

    old_server, new_server, bystander = ServerFactory(), ServerFactory(), ServerFactory()
    now = timezone.now()
    job = JobFactory(state=JobState.RUNNING)
    began = now - timedelta(minutes=5)
    old = AllocationFactory(
        job=job, server=old_server, started_at=began, agent_started_at=began,
        ended_at=now - timedelta(seconds=2), end_reason="preempted",
    )  # fmt: skip
    AllocationFactory(job=job, server=new_server, started_at=now - timedelta(seconds=2))  # its start is held
    AllocationFactory(job=JobFactory(state=JobState.RUNNING), server=bystander, started_at=now)
    before = {s.pk: generation(wake, s.pk) for s in (old_server, new_server, bystander)}
    exited = LeaseReport(old.lease_id, 1, "exited", now, {"exit_code": None, "signal": 15, "done_iters": 10})
    progress = LeaseReport(old.lease_id, 2, "progress", now, {"done_iters": 10})
    with django_capture_on_commit_callbacks() as callbacks:
        agent_reports_ingest(server=old_server, reports=[progress])  # no exit: nobody woken
    assert wake_callbacks(callbacks) == []
    with django_capture_on_commit_callbacks() as callbacks:
        agent_reports_ingest(server=old_server, reports=[exited])
    for cb in wake_callbacks(callbacks):
        cb()
    assert {s.pk: generation(wake, s.pk) for s in (old_server, new_server, bystander)} == {
        old_server.pk: before[old_server.pk],  # its own commands come back in the same sync
        new_server.pk: before[new_server.pk] + 1,
        bystander.pk: before[bystander.pk],
    }
    assert {new_server.pk} in published()


@pytest.mark.django_db(transaction=True)
def test_a_job_end_an_agent_reports_does_not_wake_that_agent_again(wake, rounds, user, published):
    """The exit ends the job's lease, which would wake its server's agent once committed (a lease ended
    by anyone else must be stopped there); the agent that reported it gets its commands in the same
    answer, so its server is left out of the wake: neither the wait it holds during the sync nor its
    next one may answer at once (a second sync for nothing, once per job end)."""
    from django.utils import timezone

    from tests.api.helpers import agent_client, synced

    server = make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    job = submit(user, gpus=2, iters=100)
    scheduling_round_run()
    lease = str(lease_of(job).lease_id)
    client = agent_client(server)
    at = timezone.now().isoformat()
    started = {"lease_id": lease, "seq": 1, "kind": "started", "at": at, "data": {}}
    assert synced(client, running=[lease], reports=[started])["rejected"] == []
    before = generation(wake, server.pk)
    published()  # what the round woke, read off before the exit
    done = {"exit_code": 0, "done_iters": 100}
    exited = {"lease_id": lease, "seq": 2, "kind": "exited", "at": timezone.now().isoformat(), "data": done}
    answer = synced(client, running=[], reports=[exited])
    assert answer["rejected"] == []
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED
    assert generation(wake, server.pk) == before  # the lease's end did not wake its own reporter
    assert not any(server.pk in ids for ids in published())
    assert answer["wait"]["generation"] == before  # the next wait waits


@pytest.mark.django_db
def test_draining_a_server_wakes_its_agent(wake, published, django_capture_on_commit_callbacks):
    server = make_server("gpu01", gpus=4)
    before = generation(wake, server.pk)
    with django_capture_on_commit_callbacks(execute=True):
        node_drain(server=server)
    assert generation(wake, server.pk) == before + 1 and {server.pk} in published()


@pytest.mark.django_db
def test_with_waking_off_nothing_is_registered_nor_read(
    settings, rounds, user, django_capture_on_commit_callbacks
):
    settings.ATTUNE_AGENT_WAKE = False
    server = make_server("gpu01", gpus=4)
    submit(user, gpus=2)
    with django_capture_on_commit_callbacks() as callbacks:
        scheduling_round_run()
        agents_wake_on_commit([server.pk])
    assert wake_callbacks(callbacks) == []
    assert wake_generation(server.pk) == 0


def test_a_redis_that_does_not_answer_costs_a_warning_never_an_error(settings, caplog):
    settings.ATTUNE_AGENT_WAKE = True
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    agents_wake([1, 2])
    assert wake_generation(1) == 0
    assert "could not wake the agents of servers [1, 2]" in caplog.text
    assert "generation of server 1 unavailable" in caplog.text


def test_agents_wake_bumps_each_server_once_and_publishes_them_in_one_message(wake, published):
    a, b = random.sample(range(10**8, 2 * 10**8), 2)
    before = {a: generation(wake, a), b: generation(wake, b)}
    agents_wake([b, a, a, str(b)])
    assert {a: generation(wake, a), b: generation(wake, b)} == {a: before[a] + 1, b: before[b] + 1}
    assert wake_generation(a) == before[a] + 1
    assert {a, b} in published()
    wake.delete(GENERATION_KEY.format(server_id=a), GENERATION_KEY.format(server_id=b))


def test_agents_woken_together_are_spaced_within_the_spread(settings):
    settings.ATTUNE_AGENT_WAKE_SPACING_MS = 20
    settings.ATTUNE_AGENT_WAKE_SPREAD_MAX_MS = 1000
    assert wake_spacing_s(1) == 0.0  # one agent: at once
    assert wake_spacing_s(2) == pytest.approx(0.020)
    assert wake_spacing_s(51) == pytest.approx(0.020)  # the last one a second after the first
    assert wake_spacing_s(201) == pytest.approx(1.0 / 200)  # more: closer together, still within 1 s
    settings.ATTUNE_AGENT_WAKE_SPACING_MS = 0
    assert wake_spacing_s(100) == 0.0  # spacing off: all at once


def test_a_wake_message_keeps_its_order_and_spacing_and_an_unspaced_one_wakes_at_once():
    assert wake_message_parse(wake_message([9, 3, 5], 0.02).encode()) == (pytest.approx(0.02), [9, 3, 5])
    assert wake_message_parse(b"3,5") == (0.0, [3, 5])  # a publisher from before the spacing
    assert wake_message_parse("x;3,,y,7") == (0.0, [3, 7])  # malformed parts left out
    assert wake_message_parse("inf;3") == (60.0, [3])  # never held past the longest wait


def test_agents_wake_publishes_its_servers_in_a_random_order_with_their_spacing(wake, settings, monkeypatch):
    settings.ATTUNE_AGENT_WAKE_SPACING_MS = 20
    ids = random.sample(range(10**8, 2 * 10**8), 40)
    pubsub = wake.pubsub()
    pubsub.subscribe(WAKE_CHANNEL)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    try:
        agents_wake(ids)
        agents_wake(ids)
        orders = []
        deadline = time.monotonic() + 3
        while len(orders) < 2 and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.2)
            if message and message["type"] == "message":
                spacing_s, order = wake_message_parse(message["data"])
                if set(order) == set(ids):
                    assert spacing_s == pytest.approx(0.020)
                    orders.append(order)
        assert len(orders) == 2 and all(sorted(order) == sorted(ids) for order in orders)
        # Shuffled: two orders of 40 agree with each other and with id order by chance only (40! to 1).
        assert orders[0] != orders[1] or orders[0] != sorted(ids)
    finally:
        pubsub.close()
        wake.delete(*[GENERATION_KEY.format(server_id=i) for i in ids])


# --- (d) wait tickets ---------------------------------------------------------------------------------


def test_a_wait_ticket_names_its_server():
    assert wait_ticket_server(wait_ticket(42), max_age_s=60) == 42


@pytest.mark.parametrize(
    "forge",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # signature changed
        lambda t: "43" + t[2:],  # another server's id under this server's signature
        lambda t: signing.TimestampSigner(salt="another.purpose").sign("42"),  # signed for something else
        lambda t: signing.TimestampSigner(salt=TICKET_SALT, key="not-the-secret-key").sign("42"),
        lambda t: signing.TimestampSigner(salt=TICKET_SALT).sign("gpu01"),  # signed, but not an id
        lambda t: "42",
        lambda t: "",
        lambda t: ":::",
    ],
)
def test_a_forged_or_malformed_ticket_is_refused(forge):
    assert wait_ticket_server(forge(wait_ticket(42)), max_age_s=60) is None


def test_an_expired_ticket_is_refused(monkeypatch):
    ticket = wait_ticket(42)
    real = time.time
    monkeypatch.setattr(signing, "time", SimpleNamespace(time=lambda: real() + 3601))
    assert wait_ticket_server(ticket, max_age_s=3600) is None
    assert wait_ticket_server(ticket, max_age_s=7200) == 42


# --- the hub: no wake lost while a read is in flight ------------------------------------------------


def run_in_own_thread(coroutine):
    """asyncio.run on a thread of its own: in the whole suite the browser tests' playwright keeps an
    event loop running on the main thread, where asyncio.run refuses to start another."""
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", asyncio.run(coroutine)))
    thread.start()
    thread.join(30)
    return result["value"]


def test_a_wake_that_lands_while_the_generation_is_read_is_not_lost():
    """The bump and its message arrive after Redis answered the read, but before the waiter resumed:
    the waiter must read again at once, not sleep until its timeout."""

    class RacingHub(agent_wait.WakeHub):
        def __init__(self) -> None:
            super().__init__("redis://unused")
            self.value, self.reads = 0, 0

        def _ensure_listening(self) -> None:
            pass

        async def generation(self, server_id: int) -> int:
            self.reads += 1
            answered = self.value
            if self.reads == 1:
                self.value += 1
                self._wake(str(server_id).encode())
            await asyncio.sleep(0)
            return answered

    hub = RacingHub()
    started = time.monotonic()
    assert run_in_own_thread(hub.wait(7, 0, timeout_s=3.0)) == (1, True)
    assert time.monotonic() - started < 1.0 and hub.reads == 2


def test_waiters_woken_together_are_answered_in_the_message_order_a_spacing_apart():
    """Five servers' waiters, one message with a 150 ms spacing: the first answered at once, the n-th
    about n spacings later, in the message's order."""

    class SpacedHub(agent_wait.WakeHub):
        def __init__(self) -> None:
            super().__init__("redis://unused")
            self.generations: dict[int, int] = {}

        def _ensure_listening(self) -> None:
            pass

        async def generation(self, server_id: int) -> int:
            return self.generations.get(server_id, 0)

    async def scenario() -> dict[int, float]:
        hub = SpacedHub()
        order = [14, 11, 13, 10, 12]
        answered: dict[int, float] = {}

        async def one(server_id: int) -> None:
            assert await hub.wait(server_id, 0, timeout_s=5.0) == (1, True)
            answered[server_id] = time.monotonic() - started

        waiters = [asyncio.create_task(one(server_id)) for server_id in order]
        await asyncio.sleep(0.1)  # every waiter is waiting
        hub.generations = dict.fromkeys(order, 1)
        started = time.monotonic()
        hub._wake(wake_message(order, 0.150).encode())
        await asyncio.gather(*waiters)
        return {position: answered[server_id] for position, server_id in enumerate(order)}

    answered = run_in_own_thread(scenario())
    assert answered[0] < 0.1
    for position in range(1, 5):
        assert position * 0.150 - 0.01 <= answered[position] < position * 0.150 + 0.12, answered
    assert list(answered.values()) == sorted(answered.values())


# --- (e) the long-poll under a real ASGI server --------------------------------------------------------


@pytest.fixture
def asgi_server(wake, monkeypatch) -> Iterator[str]:
    """config.asgi's application under uvicorn on a free port, in a thread; its base URL."""
    pytest.importorskip("uvicorn")
    from config import asgi

    monkeypatch.setattr(agent_wait, "_hub", None)  # a hub of this server's event loop
    # Django's threads (config/wsgi_bridge.py's pool) close their connections after each request, so
    # that none is left open on the test database when the test ends.
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)
    with uvicorn_serving(asgi.application, lifespan="on") as base_url:
        yield base_url


@pytest.fixture
def server_id(wake) -> Iterator[int]:
    """A server id no other test uses, its generation reset; no database row is needed to wait."""
    sid = random.randrange(10**8, 2 * 10**8)
    wake.delete(GENERATION_KEY.format(server_id=sid))
    yield sid
    wake.delete(GENERATION_KEY.format(server_id=sid))


def test_a_wait_blocks_until_its_server_is_woken(asgi_server, server_id):
    seen = wake_generation(server_id)
    params = {"ticket": wait_ticket(server_id), "generation": seen, "timeout_s": 10}
    with httpx.Client(base_url=asgi_server, timeout=20) as client, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.get, AGENT_WAIT_PATH, params=params)
        time.sleep(0.5)
        assert not pending.done()
        woken_at = time.monotonic()
        agents_wake([server_id])
        response = pending.result(timeout=1.0)
        assert time.monotonic() - woken_at < 1.0
    assert response.status_code == 200
    assert response.json() == {"generation": seen + 1, "woken": True}


def test_a_wait_of_another_server_is_not_woken(asgi_server, server_id):
    params = {"ticket": wait_ticket(server_id), "generation": 0, "timeout_s": 1.5}
    with httpx.Client(base_url=asgi_server, timeout=20) as client, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.get, AGENT_WAIT_PATH, params=params)
        time.sleep(0.3)
        agents_wake([server_id + 1])
        time.sleep(0.3)
        assert not pending.done()
        assert pending.result(timeout=5).json() == {"generation": 0, "woken": False}


def test_a_wait_that_is_not_woken_answers_after_its_timeout(asgi_server, server_id):
    started = time.monotonic()
    response = httpx.get(
        asgi_server + AGENT_WAIT_PATH,
        params={"ticket": wait_ticket(server_id), "generation": 0, "timeout_s": 1},
        timeout=10,
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 200 and response.json() == {"generation": 0, "woken": False}
    assert 0.9 <= elapsed < 3.0


def test_a_wait_behind_the_generation_answers_at_once(asgi_server, server_id):
    agents_wake([server_id])
    started = time.monotonic()
    response = httpx.get(
        asgi_server + AGENT_WAIT_PATH,
        params={"ticket": wait_ticket(server_id), "generation": 0, "timeout_s": 10},
        timeout=10,
    )
    assert response.json() == {"generation": 1, "woken": True} and time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    "ticket",
    [
        "42:1vXyzA:forged-signature",
        signing.TimestampSigner(salt="another.purpose").sign("42"),
        "not-a-ticket",
    ],
    ids=["forged", "another-purpose", "not-a-ticket"],  # a signed ticket's text changes every collection
)
def test_a_bad_ticket_is_401(asgi_server, ticket):
    response = httpx.get(
        asgi_server + AGENT_WAIT_PATH, params={"ticket": ticket, "generation": 0, "timeout_s": 1}, timeout=10
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Ticket")
    assert "sync again" in response.json()["detail"]


def test_an_expired_ticket_is_401(asgi_server, monkeypatch):
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(signing, "time", SimpleNamespace(time=lambda: real() - agent_wait.TICKET_MAX_AGE_S - 60))
        old = wait_ticket(42)
    response = httpx.get(
        asgi_server + AGENT_WAIT_PATH, params={"ticket": old, "generation": 0, "timeout_s": 1}, timeout=10
    )
    assert response.status_code == 401


@pytest.mark.parametrize(
    "query",
    [
        {"ticket": None},  # left out
        {"ticket": ""},
        {"generation": "x"},
        {"generation": "-1"},
        {"generation": "1.5"},
        {"timeout_s": "soon"},
        {"timeout_s": "-1"},
        {"timeout_s": "61"},
        {"timeout_s": "nan"},
        {"timeout_s": "inf"},
    ],
)
def test_a_malformed_query_is_400(asgi_server, query):
    params = {"ticket": wait_ticket(42), "generation": "0", "timeout_s": "1", **query}
    params = {k: v for k, v in params.items() if v is not None}
    response = httpx.get(asgi_server + AGENT_WAIT_PATH, params=params, timeout=10)
    assert response.status_code == 400, response.text
    assert response.json()["detail"]


def test_the_wait_is_get_only(asgi_server):
    response = httpx.post(asgi_server + AGENT_WAIT_PATH, params={"ticket": wait_ticket(42)}, timeout=10)
    assert response.status_code == 405


@pytest.mark.django_db
def test_django_is_served_through_the_same_application(asgi_server):
    health = httpx.get(asgi_server + "/healthz", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok", "database": connection.vendor}
    # An agent call without its token: Django's answer, not the wait handler's.
    refused = httpx.post(asgi_server + SYNC, json={"sample": usage_sample()}, timeout=10)
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
    # The wait path is matched exactly: below it is Django's (a JSON 404 under /api/).
    assert httpx.get(asgi_server + AGENT_WAIT_PATH + "/more", timeout=10).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_an_agent_syncs_waits_and_is_woken_by_a_cancel_through_the_asgi_application(
    asgi_server, rounds, user
):
    """The whole loop over HTTP: a sync offers the wait; the agent waits; a user cancels its job (a
    committed transaction); the wait answers at once; the next sync carries the cancel."""
    server = make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    job = submit(user, gpus=2)
    scheduling_round_run()
    lease = str(lease_of(job).lease_id)
    token = agent_credential_issue(server=server)
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=asgi_server, headers=headers, timeout=20) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        first = client.post(SYNC, json={"sample": usage_sample(), "running": [lease]})
        assert first.status_code == 200, first.text
        assert first.json()["commands"] == []
        offer = first.json()["wait"]
        assert offer["url"] == AGENT_WAIT_PATH
        params = {"ticket": offer["ticket"], "generation": offer["generation"], "timeout_s": 10}
        pending = pool.submit(client.get, offer["url"], params=params)
        time.sleep(0.5)
        assert not pending.done()
        cancelled_at = time.monotonic()
        job_cancel(job=job, by=user)  # commits: the wake goes out on commit
        woken = pending.result(timeout=1.0)
        assert time.monotonic() - cancelled_at < 1.0
        assert woken.json() == {"generation": offer["generation"] + 1, "woken": True}
        second = client.post(SYNC, json={"sample": usage_sample(), "running": [lease]}).json()
    assert second["commands"] == [{"kind": "cancel", "lease_id": lease, "grace_s": 10}]
    assert second["wait"]["generation"] == offer["generation"] + 1
    wake = redis.Redis.from_url(django_settings.REDIS_URL)
    wake.delete(GENERATION_KEY.format(server_id=server.pk))
