"""The REST calls the command line makes, and the service's errors as messages a user can act on."""

from __future__ import annotations

from typing import Any

import httpx

TIMEOUT_S = 30.0


class CliError(Exception):
    """Something the user should read; the command exits with `exit_code`. `fields` holds a refusal's
    per-field messages ({"workload": ["..."]}) for a command that can explain one better."""

    def __init__(self, message: str, *, exit_code: int = 1, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.fields = fields or {}


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
        self, server: str, token: str | None, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        headers = {"Authorization": f"Token {token}"} if token else {}
        self.server = server
        self._client = httpx.Client(base_url=server, headers=headers, timeout=TIMEOUT_S, transport=transport)

    def close(self) -> None:
        self._client.close()

    def request(
        self, method: str, path: str, *, not_found: str | None = None, text: bool = False, **kwargs: Any
    ) -> Any:
        """The answer's JSON (its text when `text`); a refusal or failure as CliError."""
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach the Attune service at {self.server}: {exc}") from exc
        if response.status_code == 401 or response.status_code == 403:
            raise CliError(
                f"the service at {self.server} does not know you: run `python -m cli login` "
                "or set ATTUNE_TOKEN"
            )
        try:
            body = response.json() if response.content and not (text and response.is_success) else None
        except ValueError:
            body = response.text[:500]
        if response.status_code == 404:
            raise CliError(not_found or f"{path} is not on {self.server}: is that the Attune service?")
        if response.status_code >= 400:
            fields = body if isinstance(body, dict) else None
            raise CliError("\n".join(error_lines(body)) or f"HTTP {response.status_code}", fields=fields)
        return response.text if text else body

    def token(self, username: str, password: str) -> str:
        body = self.request("POST", "/api/v1/auth/token/", json={"username": username, "password": password})
        return str(body["token"])

    def submit(self, job: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/jobs/", json=job)

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

    def change(self, job_id: int, action: str) -> dict[str, Any]:
        """POST one of the job's actions: cancel, hold or release."""
        return self.request("POST", f"/api/v1/jobs/{job_id}/{action}/", not_found=_no_job(job_id))


def _no_job(job_id: int) -> str:
    return f"no job {job_id} (or not yours to see)"
