"""The on-disk spool and the report sender: seq per lease, durability, acks, retries, re-sending."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from agent.client import ServiceClient, ServiceError
from agent.sender import ReportSender
from agent.spool import Spool, SpoolLockedError


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


def mock_client(handler) -> ServiceClient:
    return ServiceClient("http://service", "tok", transport=httpx.MockTransport(handler))


def test_sender_deletes_acked_and_rejected_and_keeps_the_rest(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    for kind in ("started", "progress", "log"):
        spool.append("a", kind, {})

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer tok"
        assert request.url.path == "/api/v1/agent/reports"
        return httpx.Response(
            200, json={"acked": [["a", 1]], "rejected": [{"lease_id": "a", "seq": 2, "error": "bad"}]}
        )

    sender = ReportSender(spool, mock_client(handler))
    assert sender.send_batch() == 2
    assert [(r.seq, r.kind) for r in spool.pending()] == [(3, "log")]


def test_sender_retries_connection_errors_and_5xx_with_backoff(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "started", {"pid": 1})
    attempts = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        if len(attempts) == 1:
            raise httpx.ConnectError("refused")
        if len(attempts) == 2:
            return httpx.Response(503, json={"detail": "restarting"})
        reports = json.loads(request.content)["reports"]
        return httpx.Response(
            200, json={"acked": [[r["lease_id"], r["seq"]] for r in reports], "rejected": []}
        )

    sender = ReportSender(spool, mock_client(handler), max_backoff_s=0.05)
    assert sender.send_batch() == 1
    assert len(attempts) == 3 and spool.pending_count() == 0


def test_sender_does_not_retry_a_refused_batch(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "started", {})
    sender = ReportSender(spool, mock_client(lambda request: httpx.Response(401, json={"detail": "token"})))
    with pytest.raises(ServiceError) as info:
        sender.send_batch()
    assert info.value.status_code == 401 and spool.pending_count() == 1  # kept for later


def test_unacked_reports_are_resent_after_restart_and_acked_ones_are_not(tmp_path):
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path)
    for i in range(4):
        spool.append("a", "progress", {"done_iters": i})
    # The service acknowledges only the first two, then the agent "crashes".
    first = ReportSender(
        spool, mock_client(lambda r: httpx.Response(200, json={"acked": [["a", 1], ["a", 2]]}))
    )
    first.send_batch()
    spool.close()

    received = []

    def handler(request: httpx.Request) -> httpx.Response:
        reports = json.loads(request.content)["reports"]
        received.extend((r["lease_id"], r["seq"]) for r in reports)
        return httpx.Response(200, json={"acked": [[r["lease_id"], r["seq"]] for r in reports]})

    restarted = ReportSender(Spool(path), mock_client(handler))
    restarted.flush()
    assert received == [("a", 3), ("a", 4)]
    assert restarted.spool.pending_count() == 0


def test_sender_thread_stops_promptly_while_backing_off(tmp_path):
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append("a", "started", {})
    stop = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    sender = ReportSender(spool, mock_client(handler), stop_event=stop, max_backoff_s=30)
    sender.start()
    stop.set()
    sender.join(2.0)
    assert not sender._thread.is_alive()
    assert spool.pending_count() == 1
