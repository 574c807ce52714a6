"""An HTTP proxy in front of the live service that loses answers: the request reaches the service (the
job is committed) and the connection is then closed without a word, as a dropped network link does."""

from __future__ import annotations

import http.client
import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


class _Handler(socketserver.BaseRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = dict(line.split(": ", 1) for line in header_lines)
        length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
        while len(body) < length:
            body += self.request.recv(65536)
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        forwarded = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}
        upstream.request(method, target, body=body, headers=forwarded)
        response = upstream.getresponse()
        content = response.read()
        upstream.close()
        self.server.seen.append((method, target, headers.get("Idempotency-Key"), response.status))
        if self.server.drop(method, target):
            return  # the service answered; the client never hears it (the socket closes now)
        lines = [f"HTTP/1.1 {response.status} {response.reason}"]
        lines += [f"{k}: {v}" for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
        lines += [f"Content-Length: {len(content)}", "Connection: close"]
        self.request.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + content)


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: str, drop: Callable[[str, str], bool]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.drop = drop
        self.seen: list[tuple[str, str, str | None, int]] = []


@contextmanager
def dropping_proxy(upstream: str, *, drop_first: int, method: str, path: str) -> Iterator[_ProxyServer]:
    """A proxy to `upstream` that drops the answers of the first `drop_first` `method` `path` requests;
    `.url` is its address and `.seen` every request (method, path, Idempotency-Key, service's status)."""
    dropped = 0
    lock = threading.Lock()

    def drop(request_method: str, target: str) -> bool:
        nonlocal dropped
        with lock:
            if request_method == method and target.split("?")[0] == path and dropped < drop_first:
                dropped += 1
                return True
        return False

    server = _ProxyServer(upstream, drop)
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
