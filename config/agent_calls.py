"""The agents' register and sync calls served beside Django's request cycle: a well-formed call is
answered without Django's middleware chain, its URL resolution and DRF's view machinery: 0.25 to 0.55
ms of the web tier's CPU an interval sync, 9 to 15 % of it (docs/performance.md, "Where a sync's CPU
goes").

What is kept, each by the code the Django path runs: the Host header checked against ALLOWED_HOSTS;
the token checked by `AgentTokenAuthentication` (hashed tokens, the throttled touch); the body bounded
and its nesting counted as `BoundedJSONParser` does, then parsed as DRF's JSONParser parses it (NaN and
Infinity refused); every field checked (`sync_body_check`, the register serializer); the answer built by
the views' own functions (`sync_answer`, `register_answer`), rendered by DRF's JSONRenderer, with DRF's
`Allow` and `Vary` headers and the headers the project's middleware adds to a response (security,
Content-Security-Policy, Content-Length, X-Frame-Options); an exception answered by Django's handler500
and logged as Django logs it. Anything else, a request that is not quite ordinary or one the Django
path refuses (no or a bad token, another content type or Accept header, a query string, a body that
does not parse or check, one larger than BUFFERED_BODY_MAX_BYTES, any call while MIDDLEWARE holds a
middleware this module does not know), goes to Django, whose answer stays the protocol's: this path
answers only what the views would answer 200 or 409 (or a 500, as Django's handler), never a refusal
of its own. tests/api/test_agent_native.py checks that both paths answer alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import cache
from io import BytesIO
from typing import Any

from django.conf import settings
from django.core import signals
from django.core.exceptions import DisallowedHost
from django.core.handlers.exception import response_for_exception
from django.core.handlers.wsgi import WSGIRequest
from django.core.signals import setting_changed
from django.http import HttpResponse
from django.utils.module_loading import import_string
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.json import strict_constant

from cluster_app.agent_call_counter import count_agent_call
from cluster_app.authentication import AgentTokenAuthentication
from config.wsgi_bridge import BUFFERED_BODY_MAX_BYTES
from infra.prepared_sql import prepared_statements
from scheduler_app.api.agent_checks import sync_body_check
from scheduler_app.api.agent_views import SYNC_CHECKER, register_answer, sync_answer
from scheduler_app.api.parsers import MAX_JSON_DEPTH, json_depth
from scheduler_app.api.serializers.agents import AgentRegisterSerializer

SYNC_PATH = "/api/v1/agent/sync"
REGISTER_PATH = "/api/v1/agent/register"
# What DRF's views add to every answer: the methods they allow, and Vary (two renderers are offered).
VIEW_HEADERS = (("Allow", "POST, OPTIONS"), ("Vary", "Accept"))
# An Accept header that makes DRF choose its JSON renderer without a parameter (an `indent=` would).
PLAIN_ACCEPT = frozenset({"", "*/*", "application/json"})
# The middleware that adds headers to an agent's answer, applied in MIDDLEWARE's order, innermost first.
HEADER_MIDDLEWARE = frozenset(
    {
        "django.middleware.security.SecurityMiddleware",
        "config.csp_middleware.PolicyOnceCSPMiddleware",
        "csp.middleware.CSPMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    }
)
# The middleware that does nothing to an agent's call (no session, CSRF cookie, message or lockout on
# these calls; static files are elsewhere). Any other in MIDDLEWARE (one added later) sends every call
# through Django's handler until it is classed here.
INERT_MIDDLEWARE = frozenset(
    {
        "whitenoise.middleware.WhiteNoiseMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "axes.middleware.AxesMiddleware",
    }
)
_RENDERER = JSONRenderer()
_AUTHENTICATION = AgentTokenAuthentication()

Answer = Callable[[Any, dict[str, Any]], tuple[int, dict[str, Any]] | None]


def _sync(server: Any, data: Any) -> tuple[int, dict[str, Any]] | None:
    body = sync_body_check(data, SYNC_CHECKER)
    if body is None:  # malformed, or merely unusual: the view's serializer words the answer
        return None
    count_agent_call("sync")
    return sync_answer(server=server, body=body)


def _register(server: Any, data: Any) -> tuple[int, dict[str, Any]] | None:
    serializer = AgentRegisterSerializer(data=data)
    if not serializer.is_valid():
        return None
    count_agent_call("register")
    return register_answer(server=server, serializer=serializer)


ANSWERS: dict[str, Answer] = {SYNC_PATH: _sync, REGISTER_PATH: _register}


def is_agent_call(environ: dict[str, Any]) -> bool:
    """A POST to one of this module's paths (what it may answer; the rest is Django's at once)."""
    return environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO") in ANSWERS


def _ordinary(environ: dict[str, Any]) -> bool:
    """Whether the request is as an agent sends it, so that the Django path would take the same steps:
    JSON in, JSON out without a parameter, no query string (DRF reads `?format=`), a body that the web
    tier read whole, nothing the middleware would redirect or refuse before the view."""
    length = environ.get("CONTENT_LENGTH", "")
    return (
        environ.get("CONTENT_TYPE") == "application/json"
        and environ.get("HTTP_ACCEPT", "") in PLAIN_ACCEPT
        and not environ.get("QUERY_STRING")
        and length.isdigit()
        and 0 < int(length) <= BUFFERED_BODY_MAX_BYTES
        and not settings.SECURE_SSL_REDIRECT
        and not settings.PREPEND_WWW
        and not settings.DISALLOWED_USER_AGENTS
    )


def agent_answer(environ: dict[str, Any]) -> tuple[WSGIRequest, HttpResponse | None]:
    """The request, and the answer to it where this path gives one; None: Django's handler answers
    (`environ`'s body is left readable again for it). No signal is sent here: the callers send Django's
    request_started and request_finished as their handler would."""
    request = WSGIRequest(environ)
    middleware = _header_middleware()
    if middleware is None or not _ordinary(environ):
        return request, None
    try:
        request.get_host()  # ALLOWED_HOSTS, as CommonMiddleware checks it
    except DisallowedHost:
        return request, None
    answer = ANSWERS[environ["PATH_INFO"]]
    body = b""
    try:
        # From the credential to the answer: an agent's statements repeat every call (prepared_sql.py).
        with prepared_statements():
            try:
                authenticated = _AUTHENTICATION.authenticate(request)
            except exceptions.AuthenticationFailed:
                authenticated = None
            if authenticated is None:
                return request, _handed_back(request, environ, body)
            # Read as DRF's parser reads it (the stream, not request.body and its upload limit).
            body = request.read()
            data = _parsed(body)
            if data is None:
                return request, _handed_back(request, environ, body)
            answered = answer(authenticated[1], data)
            if answered is None:
                return request, _handed_back(request, environ, body)
            status, payload = answered
            response = HttpResponse(_RENDERER.render(payload), status=status, content_type="application/json")
            for name, value in VIEW_HEADERS:
                response.headers[name] = value
    except Exception as exc:  # as Django's handler: logged, handler500's answer
        response = response_for_exception(request, exc)
    for one in middleware:
        response = one.process_response(request, response)
    return request, response


def _handed_back(request: WSGIRequest, environ: dict[str, Any], body: bytes) -> None:
    """None, once `environ` can be read again by Django's handler (what this request read of it)."""
    if request._read_started:
        environ["wsgi.input"] = BytesIO(body)
    return None


def _parsed(body: bytes) -> Any:
    """The body as DRF's JSONParser reads it (UTF-8, NaN and Infinity refused); None where that parser
    or BoundedJSONParser's depth bound would refuse it."""
    if json_depth(body) > MAX_JSON_DEPTH:
        return None
    try:
        return json.loads(body.decode("utf-8"), parse_constant=strict_constant)
    except (ValueError, RecursionError):
        return None


@cache
def _header_middleware() -> tuple[Any, ...] | None:
    """The project's middleware instances that add headers to an answer, innermost first (each's
    process_response, as Django's chain would call it); None where MIDDLEWARE holds one this module
    does not know."""
    if not set(settings.MIDDLEWARE) <= HEADER_MIDDLEWARE | INERT_MIDDLEWARE:
        return None
    chain = [
        import_string(path)(lambda request: None) for path in settings.MIDDLEWARE if path in HEADER_MIDDLEWARE
    ]
    return tuple(reversed(chain))


def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # Tests change settings: the middleware read theirs when built.
    if setting == "MIDDLEWARE" or setting.startswith(("SECURE_", "X_FRAME", "CONTENT_SECURITY")):
        _header_middleware.cache_clear()


setting_changed.connect(_settings_changed)


class AgentCallsFirst:
    """A WSGI application: the agents' well-formed calls answered here (`agent_answer`), every other
    request by `app` (Django's). Sends Django's request signals as its WSGIHandler does: a request's
    database connection is checked before and after, as for any other request."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not is_agent_call(environ):
            return self._app(environ, start_response)
        signals.request_started.send(sender=self.__class__, environ=environ)
        _, response = agent_answer(environ)
        if response is None:
            return self._app(environ, start_response)
        status = f"{response.status_code} {response.reason_phrase}"
        start_response(status, list(response.items()))
        return response  # closed by the server: Django's request_finished
