"""The REST calls the command line makes, and the service's errors as messages a user can act on."""

from __future__ import annotations

import html
import re
import sys
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import tenacity

from cli.config import program

TIMEOUT_S = 30.0
# A submission whose answer was lost (a dropped connection, a timeout, a proxy's 502/503/504) is sent
# again with the same Idempotency-Key: the service answers a retry with the job the first attempt
# queued, never a second one (docs/rest-api.md). A 409 is the service still running the first attempt.
SUBMIT_ATTEMPTS = 5
RETRY_BACKOFF_S = 0.5  # doubled after each attempt, at most RETRY_BACKOFF_MAX_S: 7.5 s over 5 attempts
RETRY_BACKOFF_MAX_S = 8.0
RETRY_STATUS = frozenset({409, 502, 503, 504})
RETRY_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
IDS_PER_REQUEST = 200  # job ids per list request: keeps the URL under servers' request-line limits


class CliError(Exception):
    """Something the user should read; the command exits with `exit_code`. `fields` holds a refusal's
    per-field messages ({"workload": ["..."]}) for a command that can explain one better."""

    def __init__(self, message: str, *, exit_code: int = 1, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.fields = fields or {}


def _plain_text(response: httpx.Response) -> str:
    """A body that is not JSON, as one short line: an HTML page's title, else its first 200 characters."""
    text = response.text
    if "html" in response.headers.get("content-type", ""):
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        text = html.unescape(title.group(1)) if title else re.sub(r"<[^>]+>", " ", text)
    return " ".join(text.split())[:200]


def error_lines(body: Any) -> list[str]:
    """DRF's error bodies ({"field": ["msg"]}, {"detail": "msg"}) as "field: msg" lines."""
    if isinstance(body, dict):
        lines = []
        for field, messages in body.items():
            for message in messages if isinstance(messages, list) else [messages]:
                general = field in ("detail", "non_field_errors")
                lines.append(str(message) if general else f"{field}: {message}")
        return lines
    if isinstance(body, list):
        return [str(m) for m in body]
    return [str(body)]


class Api:
    """One service, one user: JSON in and out, every failure raised as CliError."""

    def __init__(
        self,
        server: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        headers = {"Authorization": f"Token {token}"} if token else {}
        self.server = server
        self._client = httpx.Client(base_url=server, headers=headers, timeout=TIMEOUT_S, transport=transport)
        self._sleep = sleep or tenacity.nap.sleep  # tests pass a fake clock

    def close(self) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        not_found: str | None = None,
        text: bool = False,
        retry: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The answer's JSON (its text when `text`); a refusal or failure as CliError. `retry` (only for
        a request the service answers idempotently) sends it again after a lost answer."""
        try:
            send = self._send_retrying if retry else self._send
            response = send(method, path, **kwargs)
        except httpx.HTTPError as exc:
            again = f" (the service may have queued it: `{program()} queue` shows it)" if retry else ""
            raise CliError(f"cannot reach the Attune service at {self.server}: {exc}{again}") from exc
        if response.status_code == 401:
            raise CliError(
                f"the service at {self.server} does not know you: run `{program()} login` or set ATTUNE_TOKEN"
            )
        try:
            body = response.json() if response.content and not (text and response.is_success) else None
        except ValueError:
            body = _plain_text(response)
        if response.status_code >= 500 and not isinstance(body, dict):
            # A crash page (HTML under DEBUG) or a proxy's: nothing the user can act on but where to look.
            raise CliError(
                f"the Attune service at {self.server} failed on {method} {path} (HTTP "
                f"{response.status_code}); its log says why"
            )
        if response.status_code == 403:
            # Logged in, but not allowed: the service says what (another user's job, staff only...).
            raise CliError("\n".join(error_lines(body)) if body else "not allowed (HTTP 403)")
        if response.status_code == 404:
            raise CliError(not_found or f"{path} is not on {self.server}: is that the Attune service?")
        if response.status_code >= 400:
            fields = body if isinstance(body, dict) else None
            raise CliError("\n".join(error_lines(body)) or f"HTTP {response.status_code}", fields=fields)
        return response.text if text else body

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._client.request(method, path, **kwargs)

    def _send_retrying(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send until an answer that is not RETRY_STATUS comes back, at most SUBMIT_ATTEMPTS times with
        a growing pause; the last attempt's answer or error is the result."""

        def lost(state: tenacity.RetryCallState) -> bool:
            outcome = state.outcome
            if outcome is None:
                return False
            if outcome.failed:
                return isinstance(outcome.exception(), RETRY_ERRORS)
            return outcome.result().status_code in RETRY_STATUS

        def notice(state: tenacity.RetryCallState) -> None:
            outcome = state.outcome
            why = (
                f"{type(outcome.exception()).__name__}"
                if outcome is not None and outcome.failed
                else f"HTTP {outcome.result().status_code}"
                if outcome is not None
                else "?"
            )
            sys.stderr.write(
                f"{method} {path}: no answer ({why}); sending it again in {state.upcoming_sleep:.1f} s "
                f"(attempt {state.attempt_number + 1} of {SUBMIT_ATTEMPTS}, the same Idempotency-Key)\n"
            )

        retrying = tenacity.Retrying(
            retry=lost,
            stop=tenacity.stop_after_attempt(SUBMIT_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=RETRY_BACKOFF_S, max=RETRY_BACKOFF_MAX_S),
            sleep=self._sleep,
            before_sleep=notice,
            retry_error_callback=lambda state: state.outcome.result(),  # the last answer, or raise
        )
        return retrying(self._send, method, path, **kwargs)

    def token(self, username: str, password: str) -> str:
        body = self.request("POST", "/api/v1/auth/token/", json={"username": username, "password": password})
        return str(body["token"])

    def submit(self, job: dict[str, Any]) -> dict[str, Any]:
        """Queue a job; sent with a fresh Idempotency-Key, so that a retry never queues it twice."""
        key = str(uuid.uuid4())
        return self.request("POST", "/api/v1/jobs/", json=job, headers={"Idempotency-Key": key}, retry=True)

    def _pages(self, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every item of a paged list, following the pages."""
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = self.request("GET", path, params={**params, "limit": 500, "offset": offset})
            out += page["results"]
            if not page.get("next") or not page["results"]:
                return out
            offset += len(page["results"])

    def jobs(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Every job the filters select."""
        return self._pages("/api/v1/jobs/", params)

    def jobs_by_id(self, job_ids: list[int], params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The jobs among `job_ids` that the filters select: one list request per IDS_PER_REQUEST ids
        (an array's tasks), not one request per job."""
        found: list[dict[str, Any]] = []
        for k in range(0, len(job_ids), IDS_PER_REQUEST):
            chunk = ",".join(map(str, job_ids[k : k + IDS_PER_REQUEST]))
            found += self.jobs({**(params or {}), "id": chunk})
        return found

    def workloads(self) -> list[dict[str, Any]]:
        """The catalog's workloads, by name, each with its profile's summary (null if unprofiled)."""
        return self._pages("/api/v1/workloads/", {})

    def cluster(self) -> dict[str, Any]:
        """The servers with their state, capacity and use, and the cluster's totals."""
        return self.request("GET", "/api/v1/cluster/")

    def accounting(self, params: dict[str, Any], *, csv: bool = False) -> Any:
        """The usage report (window or start/end, by): its JSON, or its CSV text when `csv`."""
        if csv:
            return self.request("GET", "/api/v1/accounting/", params={**params, "format": "csv"}, text=True)
        return self.request("GET", "/api/v1/accounting/", params=params)

    def job(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/jobs/{job_id}/", not_found=_no_job(job_id))

    def update(self, job_id: int, changes: dict[str, Any]) -> dict[str, Any]:
        """PATCH the job's limits (scontrol update): its detail as it is afterwards."""
        return self.request("PATCH", f"/api/v1/jobs/{job_id}/", json=changes, not_found=_no_job(job_id))

    def change(self, job_id: int, action: str) -> dict[str, Any]:
        """POST one of the job's actions: cancel, hold or release."""
        return self.request("POST", f"/api/v1/jobs/{job_id}/{action}/", not_found=_no_job(job_id))


def _no_job(job_id: int) -> str:
    return f"no job {job_id} (or not yours to see)"
