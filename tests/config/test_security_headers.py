"""Secure cookies, HSTS, the proxy's https header and the Content-Security-Policy: from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]


def settings_from(env: dict[str, str]) -> dict:
    """config/settings.py's security values as a fresh process with `env` reads them."""
    code = (
        "import json, config.settings as s; print(json.dumps({k: getattr(s, k) for k in ("
        "'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS',"
        "'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_HSTS_PRELOAD', 'SECURE_PROXY_SSL_HEADER',"
        "'ATTUNE_CSP')} | {"
        "'csp': bool(s.CONTENT_SECURITY_POLICY), 'csp_ro': bool(s.CONTENT_SECURITY_POLICY_REPORT_ONLY)}))"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SECURE_", "ATTUNE_CSP", "DEBUG"))}
    base = {k: v for k, v in base.items() if k not in ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_defaults_are_off_but_the_csp_and_the_demo_has_none():
    plain = settings_from({})
    assert plain["SESSION_COOKIE_SECURE"] is plain["CSRF_COOKIE_SECURE"] is False
    assert plain["SECURE_HSTS_SECONDS"] == 0 and plain["SECURE_PROXY_SSL_HEADER"] is None
    assert plain["ATTUNE_CSP"] == "on" and plain["csp"] and not plain["csp_ro"]
    demo = settings_from({"DEBUG": "1"})  # make demo
    assert demo["ATTUNE_CSP"] == "off" and not demo["csp"] and not demo["csp_ro"]


def test_the_deployment_values_come_from_the_environment():
    deployed = settings_from(
        {
            "SESSION_COOKIE_SECURE": "1",
            "CSRF_COOKIE_SECURE": "1",
            "SECURE_HSTS_SECONDS": "31536000",
            "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
            "SECURE_HSTS_PRELOAD": "1",
            "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
            "ATTUNE_CSP": "report-only",
        }
    )
    assert deployed["SESSION_COOKIE_SECURE"] is deployed["CSRF_COOKIE_SECURE"] is True
    assert deployed["SECURE_HSTS_SECONDS"] == 31536000
    assert deployed["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is deployed["SECURE_HSTS_PRELOAD"] is True
    assert deployed["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert not deployed["csp"] and deployed["csp_ro"]


def test_a_bad_csp_mode_is_refused():
    with pytest.raises(subprocess.CalledProcessError) as exc:
        settings_from({"ATTUNE_CSP": "maybe"})
    assert "ATTUNE_CSP is on, off or report-only, not 'maybe'" in exc.value.stderr


def test_compose_turns_them_on():
    import yaml

    env = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["x-attune"]["environment"]
    assert env["SESSION_COOKIE_SECURE"].endswith(":-1}") and env["CSRF_COOKIE_SECURE"].endswith(":-1}")
    assert env["SECURE_HSTS_SECONDS"] == "${SECURE_HSTS_SECONDS:-31536000}"
    assert env["SECURE_PROXY_SSL_HEADER"] == "${SECURE_PROXY_SSL_HEADER:-HTTP_X_FORWARDED_PROTO,https}"
    assert env["ATTUNE_CSP"] == "${ATTUNE_CSP:-on}"


@pytest.mark.django_db
def test_the_headers_when_configured(settings, user):
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = settings.SECURE_HSTS_PRELOAD = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client()
    page = client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")  # through the TLS proxy
    assert page["Strict-Transport-Security"] == "max-age=3600; includeSubDomains; preload"
    csp = page["Content-Security-Policy"]
    for directive in (
        "default-src 'self'",
        "script-src 'self'",
        "object-src 'none'",
        "frame-ancestors 'none'",
    ):
        assert directive in csp
    assert "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp
    assert client.cookies["csrftoken"]["secure"]
    login = client.post(
        "/accounts/login/",
        {"username": user.username, "password": "pw-for-tests"},
        HTTP_X_FORWARDED_PROTO="https",
    )
    assert login.status_code == 302 and login.cookies["sessionid"]["secure"]
    # Plain http (not through the proxy): no HSTS, which browsers would ignore there anyway.
    assert "Strict-Transport-Security" not in Client().get("/accounts/login/")


@pytest.mark.django_db
def test_the_csp_can_be_off_or_report_only(settings):
    settings.CONTENT_SECURITY_POLICY = None
    assert "Content-Security-Policy" not in Client().get("/accounts/login/")
    settings.CONTENT_SECURITY_POLICY_REPORT_ONLY = {"DIRECTIVES": {"default-src": ["'self'"]}}
    assert Client().get("/accounts/login/")["Content-Security-Policy-Report-Only"] == "default-src 'self'"


@pytest.mark.django_db
def test_swagger_ui_starts_from_a_script_file_not_an_inline_script(client):
    page = client.get("/api/docs/").content.decode()
    assert '<script src="/api/docs/?script="></script>' in page
    assert "<script>" not in page
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")
