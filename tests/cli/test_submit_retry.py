"""A submission whose answer is lost is sent again with its Idempotency-Key: one job, whatever was
lost. And a 403 is the service's own refusal, not a missing login."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from cli import api as cli_api
from cli.api import Api, CliError
from profiles_app.models import Workload
from scheduler_app.models import Job
from tests.api.helpers import submit
from tests.cli.dropping_proxy import dropping_proxy
from tests.cli.helpers import run
from tests.factories import UserFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fifo_proportional_minute_rounds"),
]

JOBS = "/api/v1/jobs/"
SUBMIT = ("submit", "train", "--workload", "res18", "--gpus", "1", "--iters", "5000")


@pytest.fixture
def no_pauses(monkeypatch):
    """The retries' pauses, recorded instead of slept."""
    pauses: list[float] = []
    monkeypatch.setattr(cli_api.tenacity.nap, "sleep", pauses.append)
    return pauses


def test_a_submission_whose_answer_was_dropped_is_sent_again_and_queues_one_job(service, capsys, no_pauses):
    run(capsys, "--server", service, "login", "--username", "alice")
    with dropping_proxy(service, drop_first=1, method="POST", path=JOBS) as proxy:
        code, out, err = run(capsys, "--server", proxy.url, *SUBMIT)
    assert code == 0, err
    (job,) = Job.objects.all()
    assert out.splitlines()[0] == f"Submitted job {job.pk}"
    # Both attempts reached the service with one key; the first was committed, its answer lost, and the
    # second was answered with the first one's job.
    posts = [(key, status) for method, path, key, status in proxy.seen if method == "POST" and path == JOBS]
    assert [status for _, status in posts] == [201, 201] and posts[0][0] == posts[1][0]
    assert uuid.UUID(posts[0][0]).version == 4
    assert "sending it again" in err and len(no_pauses) == 1


def test_every_submission_has_a_key_of_its_own(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    with dropping_proxy(service, drop_first=0, method="POST", path=JOBS) as proxy:
        for _ in range(2):
            assert run(capsys, "--server", proxy.url, *SUBMIT)[0] == 0
    keys = [key for method, path, key, _ in proxy.seen if method == "POST" and path == JOBS]
    assert len(set(keys)) == 2 and Job.objects.count() == 2


def _refusing(statuses: list[int], seen: list[httpx.Request]) -> httpx.MockTransport:
    """A service that answers each POST with the next status (201 with a job at the end)."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = statuses.pop(0) if statuses else 201
        if status == 201:
            return httpx.Response(201, json={"id": 7, "admission": {}})
        if status == 0:
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(status, json={"detail": "busy"})

    return httpx.MockTransport(answer)


def test_timeouts_and_gateway_errors_are_retried_with_bounded_pauses_and_one_key(no_pauses):
    seen: list[httpx.Request] = []
    api = Api("http://attune.test", "t", transport=_refusing([0, 502, 503, 504], seen))
    assert api.submit({"name": "x"})["id"] == 7
    assert len({r.headers["Idempotency-Key"] for r in seen}) == 1 and len(seen) == 5
    assert [json.loads(r.content) for r in seen] == [{"name": "x"}] * 5
    assert no_pauses == [0.5, 1.0, 2.0, 4.0]


def test_retries_stop_after_five_attempts_with_the_last_answer(no_pauses):
    seen: list[httpx.Request] = []
    api = Api("http://attune.test", "t", transport=_refusing([503] * 10, seen))
    with pytest.raises(CliError, match="busy"):
        api.submit({"name": "x"})
    assert len(seen) == cli_api.SUBMIT_ATTEMPTS == 5
    seen.clear()
    api = Api("http://attune.test", "t", transport=_refusing([0] * 10, seen))
    with pytest.raises(CliError, match="may have queued it"):
        api.submit({"name": "x"})
    assert len(seen) == 5


def test_a_refusal_is_not_retried(no_pauses):
    seen: list[httpx.Request] = []
    api = Api("http://attune.test", "t", transport=_refusing([400], seen))
    with pytest.raises(CliError, match="busy"):
        api.submit({"name": "x"})
    assert len(seen) == 1 and no_pauses == []


def test_a_403_shows_the_service_s_reason_and_a_401_asks_for_a_login(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    bob = UserFactory(username="bob")
    other = submit(bob, name="bobs", workload=Workload.objects.get(name="res18"))
    code, _, err = run(capsys, "cancel", str(other.pk))
    assert code == 1
    assert err == f"job {other.pk}: Only the job's owner or staff may change it.\n"
    assert "login" not in err
    code, _, err = run(capsys, "--token", "wrong", "cancel", str(other.pk))
    assert code == 1 and "does not know you: run `python -m cli login`" in err


def test_a_crash_page_is_reported_as_the_service_failing_not_printed(no_pauses):
    """Django's debug page (or a proxy's) is HTML: the user gets one line saying where to look."""
    page = (
        "<!DOCTYPE html><html><head><title>IntegrityError at /api/v1/jobs/</title></head><body>" + "x" * 5000
    )

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text=page, headers={"content-type": "text/html; charset=utf-8"})

    api = Api("http://attune.test", "t", transport=httpx.MockTransport(answer))
    with pytest.raises(CliError) as raised:
        api.request("GET", "/api/v1/jobs/")
    message = str(raised.value)
    assert message == (
        "the Attune service at http://attune.test failed on GET /api/v1/jobs/ (HTTP 500); its log says why"
    )


def test_a_refusal_in_html_is_shown_by_its_title():
    def answer(request: httpx.Request) -> httpx.Response:
        body = "<html><head><title>Bad Request (400)</title></head><body><h1>Bad Request</h1></body></html>"
        return httpx.Response(400, text=body, headers={"content-type": "text/html"})

    api = Api("http://attune.test", "t", transport=httpx.MockTransport(answer))
    with pytest.raises(CliError, match=r"^Bad Request \(400\)$"):
        api.request("GET", "/api/v1/jobs/")
