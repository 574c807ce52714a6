"""The on-disk spool and the syncer: seq per lease, durability, acks, retries, re-sending, and when syncs
happen (interval with jitter, urgent reports, catching up, backoff, the long-poll)."""

from __future__ import annotations

import itertools
import json
import sqlite3
import statistics
import threading
import time
from typing import Any

import httpx
import pytest

from agent import syncer as syncer_module
from agent.client import ServiceClient, ServiceError
from agent.spool import Spool, SpoolLockedError
from agent.syncer import JITTER, Syncer
from tests.agent.fake_service import WAIT_PATH, FakeService, wait_for

SAMPLE = {"sampled_at": "2025-01-01T00:00:00Z", "cpu_util_pct": 5.0, "mem_used_gb": 1.0, "gpus": []}


def test_seq_is_per_lease_and_survives_reopening(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    assert [spool.append("a", "log", {"i": i}).seq for i in range(3)] == [1, 2, 3]
    assert spool.append("b", "log", {}).seq == 1
    spool.remove([("a", 1), ("a", 2), ("a", 3)])
    spool.close()
    reopened = Spool(tmp_path / "spool.sqlite3")
    assert reopened.append("a", "progress", {"done_iters": 5}).seq == 4  # never reused, even after acks
    assert [(r.lease_id, r.seq) for r in reopened.pending()] == [("b", 1), ("a", 4)]


def test_one_agent_per_spool(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    with pytest.raises(SpoolLockedError, match="another agent"):
        Spool(tmp_path / "spool.sqlite3")
    spool.close()
    Spool(tmp_path / "spool.sqlite3").close()


def test_lease_records_and_finish_are_atomic(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    started = spool.lease_started("a", {"pid": 1}, {"pid": 1, "isolation": "affinity+rlimit"})
    assert (started.kind, started.seq) == ("started", 1)
    spool.lease_update("a", {"pid": 1, "log_offset": 10})
    assert spool.leases() == {"a": {"pid": 1, "log_offset": 10}}
    assert not spool.is_finished("a")
    exited = spool.lease_finished("a", {"exit_code": 0})
    assert (exited.kind, exited.seq) == ("exited", 2)
    assert spool.leases() == {} and spool.is_finished("a")
    spool.prune_finished(older_than_s=-1)  # unsent reports keep their lease's seq counter
    assert spool.append("a", "log", {}).seq == 3


def _fail_inserts_into(spool_path, table: str) -> None:
    """From another connection: a trigger that fails every insert into `table`, as a crash would stop
    the statement after the first of a write (SQLite keeps what an autocommit statement did)."""
    db = sqlite3.connect(str(spool_path))
    db.execute(
        f"CREATE TRIGGER fail_{table} BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, 'crash'); END"
    )
    db.commit()
    db.close()


def test_a_write_stopped_halfway_hands_out_no_seq(tmp_path):
    """The seq counter and the report are one transaction: a seq with no report stored would be a gap
    the service can never fill (seen in the agent-restart fault test: SIGKILL between the two)."""
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path)
    spool.lease_started("a", {"pid": 1}, {"pid": 1})
    _fail_inserts_into(path, "reports")
    with pytest.raises(sqlite3.IntegrityError, match="crash"):
        spool.append("a", "log", {"lines": ["x"]})
    with pytest.raises(sqlite3.IntegrityError, match="crash"):
        spool.lease_finished("a", {"exit_code": 0})
    # Nothing of either write stayed: the lease is still running, its next report still seq 2.
    assert spool.leases() == {"a": {"pid": 1}} and not spool.is_finished("a")
    spool._db.execute("DROP TRIGGER fail_reports")
    assert spool.append("a", "log", {"lines": ["x"]}).seq == 2


def test_a_finish_stopped_halfway_leaves_the_lease_to_adopt(tmp_path):
    """The `exited` report, the finished marker and dropping the record go together: a crash in between
    must not leave an exit queued for a lease that a restarted agent would adopt and report again."""
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path)
    spool.lease_started("a", {"pid": 1}, {"pid": 1})
    _fail_inserts_into(path, "finished")
    with pytest.raises(sqlite3.IntegrityError, match="crash"):
        spool.lease_finished("a", {"exit_code": 0})
    assert [(r.seq, r.kind) for r in spool.pending()] == [(1, "started")]
    assert spool.leases() == {"a": {"pid": 1}}


# -- one sync (a mock transport) -----------------------------------------------------------------


def mock_client(handler) -> ServiceClient:
    return ServiceClient("http://service", "tok", transport=httpx.MockTransport(handler))


def ack_all(request: httpx.Request) -> httpx.Response:
    reports = json.loads(request.content)["reports"]
    return httpx.Response(200, json={"acked": [[r["lease_id"], r["seq"]] for r in reports], "rejected": []})


class Commands:
    """apply_commands for a bare Syncer: remembers every list it was handed."""

    def __init__(self) -> None:
        self.applied: list[list[dict[str, Any]]] = []

    def __call__(self, commands: list[dict[str, Any]]) -> None:
        self.applied.append(commands)


def make_syncer(spool: Spool, client: ServiceClient, **kwargs: Any) -> Syncer:
    kwargs.setdefault("interval_s", 30.0)
    kwargs.setdefault("apply_commands", Commands())
    return Syncer(spool, client, sample=lambda: dict(SAMPLE), running=lambda: ["lease-r"], **kwargs)


def test_a_sync_carries_sample_running_and_reports_and_applies_the_answer(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "started", {"pid": 1})
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer tok"
        assert (request.method, request.url.path) == ("POST", "/api/v1/agent/sync")
        sent.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "state": "MIXED",
                "commands": [{"kind": "cancel", "lease_id": "lease-r"}],
                "acked": [["a", 1]],
                "rejected": [],
                "sync_interval_s": 7.5,
                "wait": None,
            },
        )

    commands = Commands()
    syncer = make_syncer(spool, mock_client(handler), apply_commands=commands)
    answer, more = syncer.sync_once()
    assert answer["state"] == "MIXED" and more is False
    assert sent[0]["sample"] == SAMPLE and sent[0]["running"] == ["lease-r"]
    assert [(r["lease_id"], r["seq"], r["kind"], r["data"]) for r in sent[0]["reports"]] == [
        ("a", 1, "started", {"pid": 1})
    ]
    assert commands.applied == [[{"kind": "cancel", "lease_id": "lease-r"}]]
    assert syncer.interval_s == 7.5  # the service sets the interval
    assert spool.pending_count() == 0 and syncer.syncs == 1
    # With nothing spooled a sync still goes (it is the heartbeat and the poll).
    syncer.sync_once()
    assert sent[1]["reports"] == [] and sent[1]["sample"] == SAMPLE


def test_sync_settles_acked_and_rejected_and_keeps_the_rest(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    for kind in ("started", "progress", "log", "log"):
        spool.append("a", kind, {})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "commands": [],
                "acked": [["a", 1]],
                "rejected": [
                    {"lease_id": "a", "seq": 2, "error": "bad", "code": 400},
                    {"lease_id": None, "seq": None, "error": "no seq", "code": 400},  # matches nothing
                ],
            },
        )

    make_syncer(spool, mock_client(handler)).sync_once()
    assert [(r.seq, r.kind) for r in spool.pending()] == [(3, "log"), (4, "log")]


def test_a_refused_sync_keeps_every_report_and_applies_nothing(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "started", {})
    commands = Commands()
    syncer = make_syncer(
        spool,
        mock_client(lambda request: httpx.Response(401, json={"detail": "token"})),
        apply_commands=commands,
    )
    with pytest.raises(ServiceError) as info:
        syncer.sync_once()
    assert info.value.status_code == 401 and not info.value.retryable
    assert spool.pending_count() == 1 and commands.applied == []  # kept for later


def test_a_lost_answer_sends_the_reports_again(tmp_path):
    """At-least-once: the service committed the batch but its answer never arrived."""
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "exited", {"exit_code": 0})
    received = []

    def handler(request: httpx.Request) -> httpx.Response:
        received.extend((r["lease_id"], r["seq"]) for r in json.loads(request.content)["reports"])
        if len(received) == 1:
            raise httpx.ReadError("connection reset")
        return ack_all(request)

    syncer = make_syncer(spool, mock_client(handler))
    with pytest.raises(ServiceError):
        syncer.sync_once()
    assert spool.pending_count() == 1
    syncer.sync_once()
    assert received == [("a", 1), ("a", 1)] and spool.pending_count() == 0


def test_unacked_reports_are_resent_after_restart_and_acked_ones_are_not(tmp_path):
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path)
    for i in range(4):
        spool.append("a", "progress", {"done_iters": i})
    # The service acknowledges only the first two, then the agent "crashes".
    first = make_syncer(
        spool, mock_client(lambda r: httpx.Response(200, json={"acked": [["a", 1], ["a", 2]]}))
    )
    first.sync_once()
    spool.close()

    received = []

    def handler(request: httpx.Request) -> httpx.Response:
        reports = json.loads(request.content)["reports"]
        received.extend((r["lease_id"], r["seq"]) for r in reports)
        return ack_all(request)

    restarted = make_syncer(Spool(path), mock_client(handler))
    restarted.sync_once()
    assert received == [("a", 3), ("a", 4)]
    assert restarted.spool.pending_count() == 0


def test_a_batch_is_at_most_batch_size_and_says_when_more_is_spooled(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    for i in range(25):
        spool.append("a", "log", {"i": i})
    sizes = []

    def handler(request: httpx.Request) -> httpx.Response:
        sizes.append(len(json.loads(request.content)["reports"]))
        return ack_all(request)

    syncer = make_syncer(spool, mock_client(handler), batch_size=10)
    assert [syncer.sync_once()[1] for _ in range(3)] == [True, True, False]
    assert sizes == [10, 10, 5] and spool.pending_count() == 0


# -- the sync loop ---------------------------------------------------------------------------------


class Recorder:
    """A mock transport handler that acks everything and records when each sync came and what it carried;
    `fail` maps a call number (1-based) to an exception to raise or a status to answer."""

    def __init__(self, fail: dict[int, Any] | None = None) -> None:
        self.fail = fail or {}
        self.times: list[float] = []
        self.batches: list[list[tuple[str, int]]] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.times.append(time.monotonic())
            n = len(self.times)
        failure = self.fail.get(n)
        if isinstance(failure, Exception):
            raise failure
        if failure is not None:
            return httpx.Response(failure, json={"detail": "no"})
        reports = json.loads(request.content)["reports"]
        with self.lock:
            self.batches.append([(r["lease_id"], r["seq"]) for r in reports])
        return ack_all(request)

    @property
    def calls(self) -> int:
        with self.lock:
            return len(self.times)


@pytest.fixture
def running_syncers():
    """Start syncers on their threads; every one is stopped and joined at the end of the test."""
    started: list[Syncer] = []

    def start(syncer: Syncer) -> Syncer:
        started.append(syncer)
        syncer.start()
        return syncer

    yield start
    for syncer in started:
        stopped_s = time.monotonic()
        syncer.stop_event.set()
        syncer.join(2.0)
        assert time.monotonic() - stopped_s < 1.0  # not even a held long-poll delays the stop
        sync_thread = next(t for t in syncer._threads if t.name == "sync")
        assert not sync_thread.is_alive(), "the sync thread outlived its stop"


def test_the_loop_catches_up_in_batches_without_waiting(tmp_path, running_syncers):
    spool = Spool(tmp_path / "spool.sqlite3")
    for i in range(25):
        spool.append("a", "log", {"i": i})
    recorder = Recorder()
    started_s = time.monotonic()
    running_syncers(make_syncer(spool, mock_client(recorder), batch_size=10, interval_s=30.0))
    wait_for(lambda: spool.pending_count() == 0, timeout_s=5)
    assert time.monotonic() - started_s < 3  # three syncs back to back, not three intervals apart
    assert [len(b) for b in recorder.batches] == [10, 10, 5]
    time.sleep(0.3)
    assert recorder.calls == 3  # then the loop waits for the interval


def test_the_loop_backs_off_on_errors_and_recovers(tmp_path, running_syncers):
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "started", {"pid": 1})
    recorder = Recorder(fail={1: httpx.ConnectError("refused"), 2: 503, 3: 502})
    syncer = make_syncer(spool, mock_client(recorder), interval_s=30.0, max_backoff_s=1.0)
    running_syncers(syncer)
    wait_for(lambda: recorder.calls >= 3, timeout_s=5)
    assert spool.pending_count() == 1  # the jobs' reports wait in the spool while the service is away
    wait_for(lambda: spool.pending_count() == 0, timeout_s=5)
    assert recorder.batches == [[("a", 1)]]
    gaps = [b - a for a, b in itertools.pairwise(recorder.times)]
    # Exponential from 0.5 s, capped at max_backoff_s: 0.5 s, 1 s, 1 s.
    assert gaps[0] == pytest.approx(0.5, abs=0.25)
    assert gaps[1] == pytest.approx(1.0, abs=0.3)
    assert gaps[2] == pytest.approx(1.0, abs=0.3)
    assert syncer.syncs == 1
    time.sleep(0.3)
    assert recorder.calls == 4  # recovered: back to the (long) interval, no backoff left over


def test_a_refused_sync_is_retried_until_the_service_takes_it(tmp_path, running_syncers):
    """A 4xx for the whole call (a token an operator is replacing) keeps the reports spooled."""
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "exited", {"exit_code": 0})
    recorder = Recorder(fail={1: 401, 2: 403})
    running_syncers(make_syncer(spool, mock_client(recorder), max_backoff_s=0.2))
    wait_for(lambda: spool.pending_count() == 0, timeout_s=5)
    assert recorder.calls == 3 and recorder.batches == [[("a", 1)]]


def test_the_loop_stops_promptly_while_backing_off(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "started", {})
    stop = threading.Event()
    recorder = Recorder(fail={n: httpx.ConnectError("refused") for n in range(1, 100)})
    syncer = make_syncer(spool, mock_client(recorder), stop_event=stop, max_backoff_s=30)
    syncer.start()
    wait_for(lambda: recorder.calls >= 2, timeout_s=5)  # in the second backoff (1 s)
    stopped_s = time.monotonic()
    stop.set()
    syncer.join(2.0)
    assert time.monotonic() - stopped_s < 0.5
    sync_thread, wait_thread = syncer._threads
    assert not sync_thread.is_alive()
    wait_for(lambda: not wait_thread.is_alive(), timeout_s=1)  # no wait was offered: nothing holds it
    assert spool.pending_count() == 1


def test_an_urgent_report_is_synced_at_once_and_others_wait_for_the_interval(tmp_path, running_syncers):
    spool = Spool(tmp_path / "spool.sqlite3")
    recorder = Recorder()
    syncer = running_syncers(make_syncer(spool, mock_client(recorder), interval_s=2.0))
    wait_for(lambda: recorder.calls == 1, timeout_s=5)
    first_s = recorder.times[0]

    spool.append("a", "progress", {"done_iters": 1})
    syncer.notify(urgent=False)
    time.sleep(0.6)
    assert recorder.calls == 1  # a progress report goes with the next sync

    spool.append("a", "exited", {"exit_code": 0})
    notified_s = time.monotonic()
    syncer.notify(urgent=True)
    wait_for(lambda: recorder.calls == 2, timeout_s=5)
    assert recorder.times[1] - notified_s < 0.5
    assert recorder.times[1] - first_s < 1.5  # well before the interval (at least 1.8 s)
    assert recorder.batches[1] == [("a", 1), ("a", 2)]  # the waiting progress report came along

    spool.append("b", "exited", {})
    syncer.notify()  # urgent unless said otherwise: exits, failed starts, profiling points
    wait_for(lambda: recorder.calls == 3, timeout_s=1)


def test_without_notices_syncs_come_at_the_interval(tmp_path, running_syncers):
    recorder = Recorder()
    running_syncers(make_syncer(Spool(tmp_path / "spool.sqlite3"), mock_client(recorder), interval_s=0.5))
    wait_for(lambda: recorder.calls >= 5, timeout_s=10)
    gaps = [b - a for a, b in itertools.pairwise(recorder.times)]
    assert all(0.4 <= gap <= 1.0 for gap in gaps), gaps


def test_jitter_keeps_each_wait_within_ten_percent_of_the_interval(tmp_path):
    syncer = make_syncer(Spool(tmp_path / "spool.sqlite3"), mock_client(ack_all), interval_s=10.0)
    waits = [syncer._next_wait_s() for _ in range(2000)]
    assert JITTER == 0.1
    assert all(9.0 <= w <= 11.0 for w in waits)
    assert max(waits) - min(waits) > 1.5  # spread over the range, so agents started together drift apart
    assert statistics.mean(waits) == pytest.approx(10.0, abs=0.2)
    syncer.interval_s = 0.5  # a new interval from a sync answer applies to the next wait
    assert all(0.45 <= syncer._next_wait_s() <= 0.55 for _ in range(200))


# -- the long-poll (a fake service over HTTP) ------------------------------------------------------


def http_syncer(service: FakeService, spool: Spool, **kwargs: Any) -> Syncer:
    return make_syncer(spool, ServiceClient(service.url, service.token, timeout_s=2.0), **kwargs)


def offering_wait(service: FakeService, *, sync_interval_s: float, wait_timeout_s: float = 20.0) -> None:
    service.sync_interval_s = sync_interval_s
    service.offer_wait = True
    service.wait_timeout_s = wait_timeout_s


def test_a_woken_wait_triggers_a_sync_at_once(tmp_path, service, running_syncers):
    offering_wait(service, sync_interval_s=2.0)
    commands = Commands()
    syncer = running_syncers(http_syncer(service, Spool(tmp_path / "spool.sqlite3"), apply_commands=commands))
    wait_for(lambda: len(service.syncs) == 1 and service.waiting == 1, timeout_s=5)
    assert service.waits[0]["query"] == {"ticket": "ticket-1", "generation": "0", "timeout_s": "20"}

    # No wake: the long-poll stays held and the next sync comes at the interval.
    wait_for(lambda: len(service.syncs) == 2, timeout_s=5)
    first, second = service.sync_times()
    assert 1.7 <= second - first <= 2.6
    # The agent took in that sync's answer (a wake while it does is answered by a second sync, by design:
    # the answer's generation was read before the commands).
    wait_for(lambda: syncer._wait and syncer._wait["ticket"] == "ticket-2", timeout_s=2)
    assert service.waiting == 1

    # New commands: the service wakes the agent, which syncs at once to fetch them.
    woken_s = time.monotonic()
    service.wake(commands=[{"kind": "cancel", "lease_id": "lease-r"}])
    wait_for(lambda: len(service.syncs) >= 3, timeout_s=2)
    assert service.sync_times()[2] - woken_s < 1.0
    wait_for(lambda: commands.applied and commands.applied[-1], timeout_s=2)
    assert commands.applied[-1] == [{"kind": "cancel", "lease_id": "lease-r"}]
    woken = [w for w in service.waits if isinstance(w.get("answer"), dict) and w["answer"]["woken"]]
    assert len(woken) == 1 and woken[0]["answer"]["generation"] == 1

    # The next wait asks about the new generation (no spinning on the old one), and without another
    # wake the sync after that waits for the interval again.
    wait_for(lambda: service.waiting == 1, timeout_s=2)
    assert service.waits[-1]["query"]["generation"] == "1"
    time.sleep(1.0)
    assert len(service.syncs) == 3, "one wake, one sync"
    assert len(service.waits) == 2  # the first, held across the second sync until the wake; the next
    wait_for(lambda: len(service.syncs) == 4, timeout_s=3)
    assert 1.7 <= service.sync_times()[3] - service.sync_times()[2] <= 2.6
    assert syncer.interval_s == 2.0


def test_a_wait_that_times_out_does_not_sync_and_waits_again(tmp_path, service, running_syncers):
    offering_wait(service, sync_interval_s=30.0, wait_timeout_s=0.2)
    running_syncers(http_syncer(service, Spool(tmp_path / "spool.sqlite3")))
    wait_for(lambda: len(service.waits) >= 4, timeout_s=5)
    assert len(service.syncs) == 1
    assert all(w.get("answer", {"woken": False})["woken"] is False for w in service.waits)


def test_without_a_working_wait_syncs_still_come_at_the_interval(
    tmp_path, service, running_syncers, monkeypatch
):
    monkeypatch.setattr(syncer_module, "WAIT_RETRY_S", 1.0)
    offering_wait(service, sync_interval_s=0.4)
    service.wait_status = 503  # Redis down on the service, or a proxy without the path
    running_syncers(http_syncer(service, Spool(tmp_path / "spool.sqlite3")))
    wait_for(lambda: len(service.syncs) >= 4, timeout_s=5)
    assert service.waits and all(w["answer"] == 503 for w in service.waits)
    assert len(service.waits) <= len(service.syncs)  # retried after WAIT_RETRY_S, not in a tight loop
    times = service.sync_times()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.3 <= gap <= 0.8 for gap in gaps), gaps


def test_the_wait_url_comes_from_the_answer(tmp_path):
    """The agent long-polls whatever path and ticket the sync answer offered (no prefix added)."""
    requests = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.method == "POST":
            return httpx.Response(
                200,
                json={
                    "commands": [],
                    "acked": [],
                    "rejected": [],
                    "wait": {"url": WAIT_PATH, "ticket": "t/1:x", "generation": 3, "timeout_s": 0.5},
                },
            )
        return httpx.Response(200, json={"generation": 3, "woken": False})

    client = mock_client(handler)
    syncer = make_syncer(Spool(tmp_path / "spool.sqlite3"), client)
    syncer.sync_once()
    offer = syncer._wait
    answer = client.wait(offer["url"], ticket=offer["ticket"], generation=offer["generation"], timeout_s=0.5)
    assert answer == {"generation": 3, "woken": False}
    get = requests[-1]
    assert (get.method, get.url.path) == ("GET", WAIT_PATH)
    assert dict(get.url.params) == {"ticket": "t/1:x", "generation": "3", "timeout_s": "0.5"}
