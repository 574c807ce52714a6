"""config/csp_middleware.py sets the same headers as django-csp's own middleware, whatever the case."""

from __future__ import annotations

import pytest
from csp.constants import HEADER, HEADER_REPORT_ONLY
from csp.exceptions import CSPNonceError
from csp.middleware import CSPMiddleware
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from config.csp_middleware import PolicyOnceCSPMiddleware

POLICY = {"DIRECTIVES": {"default-src": ["'self'"], "script-src": ["'self'", "'nonce'"]}}
OTHER = {"DIRECTIVES": {"default-src": ["'none'"]}, "EXCLUDE_URL_PREFIXES": ["/static/"]}


def _headers(middleware_class, path: str, *, nonce: bool = False, status: int = 200, **attrs) -> dict:
    def view(request):
        if nonce:
            str(request.csp_nonce)
        response = HttpResponse("{}", status=status, content_type="application/json")
        for name, value in attrs.items():
            setattr(response, name, value)
        return response

    request = RequestFactory().get(path)
    response = middleware_class(view)(request)
    return {name: response.get(name) for name in (HEADER, HEADER_REPORT_ONLY)}


CASES = [
    ("/api/v1/jobs/", {}),
    ("/api/v1/jobs/", {"nonce": True}),
    ("/api/v1/jobs/", {"_csp_exempt": True}),
    ("/api/v1/jobs/", {"_csp_update": {"img-src": ["data:"]}}),
    ("/api/v1/jobs/", {"_csp_replace": {"script-src": None}}),
    ("/api/v1/jobs/", {"_csp_config_ro": {"default-src": ["'self'"]}}),
    ("/static/app.css", {}),
    ("/missing", {"status": 404}),
]


@pytest.mark.parametrize(
    "policies",
    [
        {"CONTENT_SECURITY_POLICY": POLICY, "CONTENT_SECURITY_POLICY_REPORT_ONLY": None},
        {"CONTENT_SECURITY_POLICY": None, "CONTENT_SECURITY_POLICY_REPORT_ONLY": OTHER},
        {"CONTENT_SECURITY_POLICY": OTHER, "CONTENT_SECURITY_POLICY_REPORT_ONLY": POLICY},
        {"CONTENT_SECURITY_POLICY": None, "CONTENT_SECURITY_POLICY_REPORT_ONLY": None},
    ],
)
@pytest.mark.parametrize("debug", [False, True])
def test_the_same_headers_as_the_library(policies, debug):
    with override_settings(DEBUG=debug, **policies):
        for path, case in CASES:
            for _ in range(2):  # built, then kept
                ours = _headers(PolicyOnceCSPMiddleware, path, **case)
                theirs = _headers(CSPMiddleware, path, **case)
                if case.get("nonce"):  # a fresh nonce each response: the same header around it
                    ours = {k: v and v.split("'nonce-")[0] for k, v in ours.items()}
                    theirs = {k: v and v.split("'nonce-")[0] for k, v in theirs.items()}
                assert ours == theirs, (path, case)


def test_a_changed_policy_is_built_again():
    with override_settings(CONTENT_SECURITY_POLICY=POLICY, CONTENT_SECURITY_POLICY_REPORT_ONLY=None):
        first = _headers(PolicyOnceCSPMiddleware, "/api/")[HEADER]
    with override_settings(CONTENT_SECURITY_POLICY=OTHER, CONTENT_SECURITY_POLICY_REPORT_ONLY=None):
        assert _headers(PolicyOnceCSPMiddleware, "/api/")[HEADER] == "default-src 'none'" != first


def test_a_nonce_asked_for_after_the_header_raises_as_with_the_library():
    request = RequestFactory().get("/api/")
    with override_settings(CONTENT_SECURITY_POLICY=POLICY):
        PolicyOnceCSPMiddleware(lambda r: HttpResponse("{}"))(request)
    with pytest.raises(CSPNonceError):
        str(request.csp_nonce)
