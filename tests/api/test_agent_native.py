"""The agents' calls answered beside Django's request cycle (config/agent_calls.py) answer as the DRF
views do: the same status, body and headers for valid and invalid bodies (each call made on the same
database state, rolled back between the two paths); a well-formed call is answered there, anything
else, a refusal above all, is handed to Django's handler; nothing skips the token or the checks."""

from __future__ import annotations

import json
import uuid
from io import BytesIO
from typing import Any

import pytest
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cluster_app.agent_wake import wait_ticket_server
from cluster_app.models import AgentCredential, Server, UsageSample
from config.agent_calls import REGISTER_PATH, SYNC_PATH, AgentCallsFirst, agent_answer
from scheduler_app.models import AgentReport
from tests.api.agent_native import ROUTED, routed
from tests.api.helpers import agent_client, lease_of, make_server, usage_sample

pytestmark = pytest.mark.django_db


def sync_body(**fields: Any) -> dict[str, Any]:
    return {"sample": usage_sample(), "running": [], "reports": [], **fields}


def report(lease: Any, seq: int, kind: str, **data: Any) -> dict[str, Any]:
    return {"lease_id": str(lease), "seq": seq, "kind": kind, "at": timezone.now().isoformat(), "data": data}


def inventory(prefix: str = "GPU-native") -> dict[str, Any]:
    gpus = [
        {"index": i, "uuid": f"{prefix}-{i}", "model": "Tesla V100", "memory_mb": 32768} for i in range(4)
    ]
    return {"agent_version": "1.0.0", "hostname": "gpu01", "num_cpus": 12, "mem_gb": 250.0, "gpus": gpus}


def both(client: APIClient, path: str, body: bytes | str, **extra: Any) -> dict[str, Any]:
    """The call through each path on the same database state (rolled back after each): its answers,
    and how the native path routed it."""
    answers = {}
    for way in ("django", "native"):
        ROUTED.clear()
        with transaction.atomic(), routed(way):
            extra.setdefault("content_type", "application/json")
            answers[way] = client.post(path, data=body, **extra)
            transaction.set_rollback(True)
    answers["routed"] = dict(ROUTED)
    return answers


def assert_alike(answers: dict[str, Any], *, server: Server | None = None) -> dict[str, Any] | None:
    """The two paths' answers alike: status, headers and body (a wait ticket is dated to the second:
    each must name the server)."""
    django, native = answers["django"], answers["native"]
    assert native.status_code == django.status_code, native.content[:500]
    if django.get("Content-Type", "").startswith("application/json"):
        assert dict(native.items()) == dict(django.items())
    else:
        assert sorted(dict(native.items())) == sorted(dict(django.items()))
    if not django.get("Content-Type", "").startswith("application/json"):
        return None  # a page (DRF's browsable API, Django's 400): its CSRF token and CSP nonce vary
    bodies = [json.loads(answer.content) for answer in (django, native)]
    for body in bodies:
        if isinstance(body, dict) and body.get("wait"):
            assert wait_ticket_server(body["wait"].pop("ticket"), max_age_s=60) == server.pk
    assert bodies[0] == bodies[1]
    return bodies[0]


# --- valid calls: answered by the native path, as the view answers them -----------------------------


def test_a_sync_without_reports_is_answered_natively_as_by_the_view(server, agent):
    answers = both(agent, SYNC_PATH, json.dumps(sync_body()))
    assert answers["routed"] == {"answered": 1}
    answer = assert_alike(answers, server=server)
    assert answers["native"].status_code == 200 and answer["commands"] == [] and answer["acked"] == []


def test_a_sync_with_reports_good_bad_and_foreign_answers_alike(server, agent, running):
    lease = lease_of(running).lease_id
    reports = [
        report(lease, 1, "started", pid=4242),
        report(lease, 2, "progress", done_iters=10, iters_per_s=2.0),
        report(lease, 3, "log", lines=["epoch 1", "nul \x00 here"]),
        report(lease, 4, "progress"),  # no done_iters: rejected alone
        report(uuid.uuid4(), 1, "progress", done_iters=1),  # another server's lease: 404 alone
        None,
        "junk",
        {"lease_id": str(lease)},
    ]
    body = sync_body(running=[str(lease)], reports=reports)
    answers = both(agent, SYNC_PATH, json.dumps(body))
    assert answers["routed"] == {"answered": 1}
    answer = assert_alike(answers, server=server)
    assert [pair[1] for pair in answer["acked"]] == [1, 2, 3]
    assert len(answer["rejected"]) == 5


def test_an_exit_and_the_commands_after_it_answer_alike(server, agent, running):
    lease = lease_of(running).lease_id
    body = sync_body(running=[], reports=[report(lease, 1, "exited", exit_code=0, done_iters=1000)])
    answers = both(agent, SYNC_PATH, json.dumps(body))
    assert answers["routed"] == {"answered": 1}
    assert assert_alike(answers, server=server)["acked"] == [[str(lease), 1]]


def test_a_start_delivered_answers_alike(server, agent, running):
    answers = both(agent, SYNC_PATH, json.dumps(sync_body()))
    answer = assert_alike(answers, server=server)
    assert [command["kind"] for command in answer["commands"]] == ["start"]


def test_an_unregistered_servers_sync_is_refused_alike_and_stores_nothing(agent, server):
    Server.objects.filter(pk=server.pk).update(registered_at=None)
    answers = both(agent, SYNC_PATH, json.dumps(sync_body()))
    assert answers["routed"] == {"answered": 1}
    assert assert_alike(answers)["code"] == "not_registered"
    assert answers["native"].status_code == 409
    assert not UsageSample.objects.exists()


def test_a_registration_and_a_refused_one_answer_alike(server, agent):
    answers = both(agent, REGISTER_PATH, json.dumps(inventory()))
    assert answers["routed"] == {"answered": 1}
    assert assert_alike(answers) == {
        "server": "gpu01",
        "sync_interval_s": answers["django"].json()["sync_interval_s"],
        "fence": answers["django"].json()["fence"],
    }
    other = agent_client(make_server("gpu02", gpus=4))
    other.post(REGISTER_PATH, inventory(), format="json")
    conflict = both(agent, REGISTER_PATH, json.dumps(inventory()))
    assert conflict["routed"] == {"answered": 1}
    assert conflict["native"].status_code == 409
    assert assert_alike(conflict)["conflicting_uuids"] == [f"GPU-native-{i}" for i in range(4)]


def test_a_failure_inside_is_answered_as_djangos_500(server, agent, monkeypatch):
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("scheduler_app.api.agent_views.agent_sync", broken)
    agent.raise_request_exception = False
    answers = both(agent, SYNC_PATH, json.dumps(sync_body()))
    assert answers["native"].status_code == 500
    assert assert_alike(answers) == {"detail": "Server error; it has been logged."}


# --- refusals and unusual requests: handed to Django, answered alike -----------------------------------


def _bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=token)
    return client


@pytest.mark.parametrize("path", [SYNC_PATH, REGISTER_PATH])
@pytest.mark.parametrize(
    "authorization", [None, "Bearer not-a-real-token", "Bearer a b", "Bearer", "Basic eDp5", "Bearer \xe9"]
)
def test_a_missing_or_bad_token_is_refused_alike_and_stores_nothing(server, path, authorization):
    client = APIClient() if authorization is None else _bearer(authorization)
    body = json.dumps(sync_body() if path == SYNC_PATH else inventory())
    answers = both(client, path, body)
    assert answers["routed"] == {"handed back": 1}
    assert answers["native"].status_code == 401
    assert answers["native"]["WWW-Authenticate"] == 'Bearer realm="attune-agent"'
    assert_alike(answers)
    assert not UsageSample.objects.exists()


def test_revoked_and_user_tokens_are_refused_alike(server, agent, user):
    AgentCredential.objects.update(revoked_at=timezone.now())
    revoked = both(agent, SYNC_PATH, json.dumps(sync_body()))
    user_token = both(
        _bearer(f"Token {Token.objects.create(user=user).key}"), SYNC_PATH, json.dumps(sync_body())
    )
    user_as_bearer = both(
        _bearer(f"Bearer {Token.objects.get(user=user).key}"), SYNC_PATH, json.dumps(sync_body())
    )
    for answers in (revoked, user_token, user_as_bearer):
        assert answers["routed"] == {"handed back": 1}
        assert answers["native"].status_code == 401
        assert_alike(answers)
    assert not UsageSample.objects.exists()


BAD_SYNC_BODIES = [
    "[]",
    "5",
    "null",
    "{}",
    "{",
    '{"sample": NaN}',
    json.dumps(sync_body(sample={**usage_sample(), "cpu_util_pct": 101})),
    json.dumps(sync_body(sample={**usage_sample(), "cpu_util_pct": "40"})),
    json.dumps(sync_body(sample={**usage_sample(), "gpus": [{"uuid": "G"}] * 1025})),
    json.dumps(sync_body(running=["not-a-lease"])),
    json.dumps(sync_body(running="x")),
    json.dumps(sync_body(reports={"a": 1})),
    json.dumps(sync_body(sizes={"x": [1, 2]})),
    json.dumps(sync_body(sample={**usage_sample(), "sampled_at": "yesterday"})),
    "[" * 100 + "]" * 100,
    '{"sample": {"cpu_util_pct": 1e999}}',
    b"\xff\xfe{}",
]


@pytest.mark.parametrize("body", BAD_SYNC_BODIES)
def test_a_malformed_sync_is_refused_alike_and_stores_nothing(server, agent, body):
    answers = both(agent, SYNC_PATH, body)
    assert answers["routed"] == {"handed back": 1}
    assert answers["native"].status_code == 400
    assert_alike(answers)
    assert not UsageSample.objects.exists() and not AgentReport.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {**inventory(), "gpus": []},
        {**inventory(), "num_cpus": "12"},
        {**inventory(), "gpus": [inventory()["gpus"][0]] * 2},
        {**inventory(), "time_scale": 0},
    ],
)
def test_a_malformed_registration_is_refused_alike(server, agent, body):
    answers = both(agent, REGISTER_PATH, json.dumps(body))
    assert answers["routed"] == {"handed back": 1}
    assert answers["native"].status_code == 400
    assert_alike(answers)


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({"content_type": "text/plain"}, 415),
        ({"content_type": "application/json; charset=utf-8"}, 200),
        ({"HTTP_ACCEPT": "text/html"}, 200),  # DRF's browsable page
        ({"HTTP_ACCEPT": "application/json; indent=4"}, 200),
        ({"HTTP_ACCEPT": "application/xml"}, 406),
        ({"QUERY_STRING": "format=json"}, 200),
        ({"HTTP_HOST": "evil.example"}, 400),
    ],
)
def test_unusual_requests_are_handed_to_django(server, agent, extra, status):
    answers = both(agent, SYNC_PATH, json.dumps(sync_body()), **extra)
    assert answers["routed"] == {"handed back": 1}
    assert answers["native"].status_code == status
    assert_alike(answers, server=server)


@pytest.mark.parametrize("method", ["get", "put", "patch", "delete", "options"])
def test_other_methods_are_djangos(server, agent, method):
    with routed("native"):
        ROUTED.clear()
        response = getattr(agent, method)(SYNC_PATH)
    assert ROUTED == {}
    assert response.status_code in (200, 405)  # OPTIONS: DRF's metadata


def test_an_empty_or_a_large_body_is_djangos(server, agent):
    empty = both(agent, SYNC_PATH, "")
    assert empty["routed"] == {"handed back": 1} and empty["native"].status_code == 400
    assert_alike(empty)
    log = report(uuid.uuid4(), 1, "log", lines=["x" * 1000] * 1100)  # 1.1 MB: read as it streams
    large = both(agent, SYNC_PATH, json.dumps(sync_body(reports=[log])))
    assert large["routed"] == {"handed back": 1} and large["native"].status_code == 200
    assert_alike(large, server=server)


def test_a_middleware_it_does_not_know_sends_every_call_to_django(server, agent, settings):
    """A middleware added later may act on agents' calls: until config/agent_calls.py classes it,
    Django's handler answers them all."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    answers = both(agent, SYNC_PATH, json.dumps(sync_body()))
    assert answers["routed"] == {"handed back": 1}
    assert_alike(answers, server=server)


# --- the WSGI application the image runs ------------------------------------------------------------------


def _environ(path: str, body: bytes, **headers: str) -> dict[str, Any]:
    request = RequestFactory().post(path, data=body, content_type="application/json", **headers)
    environ = dict(request.environ)
    environ["wsgi.input"] = BytesIO(body)
    return environ


def test_the_wsgi_application_answers_agents_and_hands_the_rest_to_django(server, agent):
    token = agent._credentials["HTTP_AUTHORIZATION"]
    passed: list[str] = []
    finished: list[object] = []

    def django(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        passed.append(environ["PATH_INFO"])
        assert environ["wsgi.input"].read() == body  # a handed-back body is whole again
        start_response("418 I'm a teapot", [])
        return [b""]

    def on_finished(**kwargs: Any) -> None:
        finished.append(kwargs["sender"])

    app = AgentCallsFirst(django)
    started: list[str] = []
    body = json.dumps(sync_body()).encode()
    request_finished.connect(on_finished)
    # Django's request signals close a connection that is in a transaction (the test's): not here.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        iterable = app(_environ(SYNC_PATH, body, HTTP_AUTHORIZATION=token), lambda s, h: started.append(s))
        content = b"".join(iterable)
        iterable.close()
        app(_environ(SYNC_PATH, body, HTTP_AUTHORIZATION="Bearer nope"), lambda s, h: started.append(s))
        app(_environ("/api/v1/jobs/", body, HTTP_AUTHORIZATION=token), lambda s, h: started.append(s))
    finally:
        request_finished.disconnect(on_finished)
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    assert started == ["200 OK", "418 I'm a teapot", "418 I'm a teapot"]
    assert json.loads(content)["state"] == Server.objects.get(pk=server.pk).state
    assert passed == [SYNC_PATH, "/api/v1/jobs/"]
    assert len(finished) == 1  # the answered call's request_finished, when the server closed it


def test_the_image_serves_agents_through_this_path():
    from config import asgi

    assert isinstance(asgi.django_app._app, AgentCallsFirst)


def test_agent_answer_leaves_other_calls_alone(server, agent):
    environ = _environ(SYNC_PATH, b"{}", HTTP_AUTHORIZATION=agent._credentials["HTTP_AUTHORIZATION"])
    environ["CONTENT_TYPE"] = "text/plain"
    request, response = agent_answer(environ)
    assert response is None and not request._read_started
