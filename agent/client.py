"""HTTP client for the agent protocol (docs/agent-protocol.md): register, sync, wait."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx
import tenacity

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1/agent"
WAIT_MARGIN_S = 5.0  # a long-poll's answer may take this much longer than the wait it asked for


# Seconds an idle connection to the service is kept for reuse (config/gunicorn.conf.py keeps 75).
KEEPALIVE_S = 60.0


class ServiceError(Exception):
    """The service answered with an error, or could not be reached."""

    def __init__(self, message: str, *, status_code: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body

    @property
    def retryable(self) -> bool:
        """Connection errors, timeouts and 5xx may succeed later; 4xx are about the request itself."""
        return self.status_code is None or self.status_code >= 500 or self.status_code == 429


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, ServiceError) and exc.retryable


class ServiceClient:
    """Thin JSON-over-HTTP wrapper; every method raises ServiceError on failure. Thread-safe."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "User-Agent": "attune-agent"},
            timeout=timeout_s,
            transport=transport,
            # Kept past the sync interval (httpx closes idle connections after 5 s, so every 10 s sync
            # opened a new one) and under the server's 75 s keep-alive, so the agent closes first.
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
        )

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._http.post(f"{API_PREFIX}/{path}", json=payload)
        except httpx.HTTPError as exc:  # connection refused, timeout, broken connection...
            raise ServiceError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            try:
                body: Any = response.json()
            except ValueError:
                body = response.text[:500]
            raise ServiceError(
                f"POST {path}: HTTP {response.status_code}: {body}",
                status_code=response.status_code,
                body=body,
            )
        try:
            return response.json()
        except ValueError as exc:
            raise ServiceError(f"POST {path}: answer is not JSON", status_code=response.status_code) from exc

    def register(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._post("register", payload)

    def sync(self, payload: dict[str, Any]) -> dict[str, Any]:
        return self._post("sync", payload)

    def wait(self, path: str, *, ticket: str, generation: int, timeout_s: float) -> dict[str, Any]:
        """Long-poll `path` (the sync answer's wait.url): returns when the server's commands changed or
        after `timeout_s`."""
        params = {"ticket": ticket, "generation": str(generation), "timeout_s": f"{timeout_s:g}"}
        try:
            response = self._http.get(path, params=params, timeout=timeout_s + WAIT_MARGIN_S)
        except httpx.HTTPError as exc:
            raise ServiceError(f"GET {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ServiceError(f"GET {path}: HTTP {response.status_code}", status_code=response.status_code)
        try:
            return response.json()
        except ValueError as exc:
            raise ServiceError(f"GET {path}: answer is not JSON", status_code=response.status_code) from exc


def call_with_retry(
    fn: Callable[[], Any], *, stop_event: threading.Event, max_backoff_s: float = 30.0, what: str = "call"
) -> Any:
    """Call `fn` until it succeeds or fails for good, backing off exponentially on retryable errors.

    Waits with `stop_event.wait`, so an agent shutdown interrupts the backoff at once; raises the last
    ServiceError when stopped or when the error is not retryable.
    """

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        level = (
            logging.WARNING
            if state.attempt_number in (1, 5) or state.attempt_number % 20 == 0
            else logging.DEBUG
        )
        log.log(
            level,
            "%s failed (attempt %d, retrying in %.1fs): %s",
            what,
            state.attempt_number,
            state.upcoming_sleep,
            exc,
        )

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_retryable),
        wait=tenacity.wait_exponential(multiplier=0.5, max=max_backoff_s),
        stop=lambda _state: stop_event.is_set(),
        sleep=stop_event.wait,
        before_sleep=before_sleep,
        reraise=True,
    )
    return retrying(fn)
