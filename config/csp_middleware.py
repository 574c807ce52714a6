"""django-csp's middleware with each policy's header built once per configuration, not per response."""

from __future__ import annotations

import http.client
from typing import Any

from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.middleware import CheckableLazyObject, CSPMiddleware
from csp.utils import build_policy
from django.conf import settings

# What a view's csp decorators put on its response (a policy of its own): those go the library's way.
_RESPONSE_POLICY = (
    "_csp_config",
    "_csp_update",
    "_csp_replace",
    "_csp_config_ro",
    "_csp_update_ro",
    "_csp_replace_ro",
)
# (header, its setting, the response attribute that exempts it, report-only)
_HEADERS = (
    (HEADER, "CONTENT_SECURITY_POLICY", "_csp_exempt", False),
    (HEADER_REPORT_ONLY, "CONTENT_SECURITY_POLICY_REPORT_ONLY", "_csp_exempt_ro", True),
)
# Setting name -> (the setting's value it was built from, the policy): rebuilt when the value changes.
_built: dict[str, tuple[Any, str]] = {}


def _settings_policy(setting: str, report_only: bool) -> str:
    """The header the library builds from `setting` alone (no nonce, no per-view policy), built once
    per value of the setting."""
    source = getattr(settings, setting, None)
    kept = _built.get(setting)
    if kept is None or kept[0] is not source:
        kept = _built[setting] = (source, build_policy(report_only=report_only))
    return kept[1]


class PolicyOnceCSPMiddleware(CSPMiddleware):
    """The same headers as CSPMiddleware (tests/config/test_csp_middleware.py): a response without a
    nonce or a policy of its own, every API answer and agent sync, gets the policy built from the
    settings once, where the library built it, and the report-only one, afresh for each response
    (a few percent of a submission's or a sync's CPU in the web tier)."""

    def process_response(self, request, response):
        if getattr(request, "_csp_nonce", None) is not None or any(
            getattr(response, name, None) is not None for name in _RESPONSE_POLICY
        ):
            return super().process_response(request, response)
        debug_codes = (http.client.INTERNAL_SERVER_ERROR, http.client.NOT_FOUND)
        if response.status_code in debug_codes and settings.DEBUG:
            return response
        for header, setting, exempt, report_only in _HEADERS:
            policy = _settings_policy(setting, report_only)
            if not policy or getattr(response, exempt, False) is not False or header in response:
                continue
            prefixes = (getattr(settings, setting, None) or {}).get("EXCLUDE_URL_PREFIXES", None) or ()
            if not request.path_info.startswith(tuple(prefixes)):
                response[header] = policy
        # As the library: a nonce asked for after the header is written raises, since it would not be in it.
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response
