"""Logging filters: keep the node agents' routine requests out of the web server's access log."""

from __future__ import annotations

import logging

AGENT_PATH = "/api/v1/agent/"


class QuietAgentRequests(logging.Filter):
    """Drop runserver's access lines for agent requests that succeeded: three agents polling every two
    seconds buried the scheduler's own lines. Failed agent requests (4xx, 5xx) are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if status is not None and status >= 400:
            return True
        request = getattr(record, "request", None)
        line = str(getattr(request, "path", "") or record.getMessage())
        return AGENT_PATH not in line
