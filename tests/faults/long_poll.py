"""Checks that every web process's agent long-poll (/api/v1/agent/wait) answers and is woken through Redis."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any
from urllib.parse import urlencode

import psutil
import redis

from cluster_app.agent_wake import GENERATION_KEY, WAKE_CHANNEL, wait_ticket
from tests.faults.processes import wait_until
from tests.faults.stack import Stack

WAIT_PATH = "/api/v1/agent/wait"
HOLD_S = 20.0  # each held wait's timeout: a wake must answer it long before
WOKEN_WITHIN_S = 3.0  # the subscription delivers a wake in milliseconds; this is the margin


def _worker_of(stack: Stack, local_port: int, worker_pids: list[int]) -> int | None:
    """The web worker process that accepted our connection from `local_port` (None: not yet accepted)."""
    for pid in worker_pids:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                ours = conn.raddr and conn.raddr.port == local_port
                if ours and conn.laddr and conn.laddr.port == stack.port:
                    return pid
    return None


def _read_answer(sock: socket.socket, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of the answer on `sock` (the request asked the server to close after it)."""
    sock.settimeout(timeout_s)
    data = b""
    with contextlib.suppress(TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head:
        return 0, {}
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(body or b"{}")
    except ValueError:
        return status, {"raw": body[:200].decode(errors="replace")}


def check_long_poll_wakes(stack: Stack, *, node: str = "node1", max_connections: int = 48) -> dict[str, Any]:
    """Hold waits until every gunicorn worker process holds at least one (each accepted connection is
    traced to its process through /proc), then bump the server's generation and publish a wake as
    cluster_app/agent_wake.py does: every wait must answer 200 `woken` within WOKEN_WITHIN_S, far
    before its own timeout. A process whose Redis subscription is dead answers its waits only at their
    timeout; one whose connection pool is drained answers 503. Returns the figures it checked."""
    assert stack.web is not None
    worker_pids = sorted(c.pid for c in psutil.Process(stack.web.pid).children())
    assert worker_pids, "gunicorn has no worker processes"
    server_id = stack.scalar("SELECT id FROM cluster_app_server WHERE name = %s", [node])
    key = GENERATION_KEY.format(server_id=server_id)
    client = redis.Redis(port=stack.redis.port, db=0, socket_timeout=2)
    generation = int(client.get(key) or 0)
    ticket = wait_ticket(server_id)
    query = urlencode({"ticket": ticket, "generation": generation, "timeout_s": f"{HOLD_S:g}"})
    request = (f"GET {WAIT_PATH}?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").encode()
    held: list[tuple[socket.socket, int]] = []
    try:
        while {pid for _, pid in held} != set(worker_pids):
            assert len(held) < max_connections, (
                f"{max_connections} waits reached only web processes {sorted({p for _, p in held})} of "
                f"{worker_pids}"
            )
            sock = socket.create_connection(("127.0.0.1", stack.port), timeout=5)
            sock.sendall(request)
            local_port = sock.getsockname()[1]
            pid = wait_until(
                lambda port=local_port: _worker_of(stack, port, worker_pids),
                timeout_s=5,
                what=f"a web worker to accept the wait from port {local_port}",
                interval_s=0.02,
            )
            held.append((sock, pid))
        time.sleep(0.5)  # each request reads its generation and is registered with its process's hub
        client.incr(key)
        client.publish(WAKE_CHANNEL, f"0;{server_id}")
        t_wake = time.monotonic()
        answers = []
        for sock, pid in held:
            status, body = _read_answer(sock, HOLD_S + 5 - (time.monotonic() - t_wake))
            answers.append((pid, status, body.get("woken"), round(time.monotonic() - t_wake, 2)))
    finally:
        for sock, _ in held:
            sock.close()
        client.close()
    slow = [a for a in answers if a[1] != 200 or a[2] is not True or a[3] > WOKEN_WITHIN_S]
    per_pid = {pid: sum(a[0] == pid for a in answers) for pid in worker_pids}
    assert not slow, (
        f"waits not woken within {WOKEN_WITHIN_S:g} s of a wake (web pid, status, woken, seconds): {slow}; "
        f"all: {answers}\n{stack.tail('web.log', 3000)}"
    )
    return {"waits": len(answers), "per_process": per_pid, "slowest_s": max(a[3] for a in answers)}
