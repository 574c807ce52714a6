"""Idempotency-Key on POST /api/v1/jobs/: a retry gets the first answer, never a second job."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler_app.api import views
from scheduler_app.models import IdempotencyKey, Job
from scheduler_app.services import idempotency
from scheduler_app.services.idempotency import idempotency_keys_prune
from tests.api.helpers import make_server, workload
from tests.factories import UserFactory

JOBS = "/api/v1/jobs/"
JOB = {"name": "r18", "workload": "res18", "num_gpus": 1, "total_iters": 1000}


@pytest.fixture(autouse=True)
def scheduler(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "inline_rounds": False,
        "idempotency_key_ttl_h": 24,
    }


@pytest.fixture
def cluster():
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def post(client: APIClient, body: dict, key: str | None = None):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(JOBS, body, format="json", headers=headers)


@pytest.mark.django_db
def test_the_same_key_twice_gives_one_job_and_the_same_answer(cluster):
    client = client_for(UserFactory())
    key = str(uuid.uuid4())
    first = post(client, JOB, key)
    again = post(client, {**JOB}, key)  # the same body, sent again (a retry after a lost answer)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Job.objects.count() == 1 and first.json()["id"] == Job.objects.get().pk
    assert IdempotencyKey.objects.get().job_id == first.json()["id"]


@pytest.mark.django_db
def test_a_retry_matches_whatever_the_key_order_of_its_body(cluster):
    client = client_for(UserFactory())
    first = post(client, JOB, "k1")
    again = post(client, dict(reversed(list(JOB.items()))), "k1")
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_refused_and_changes_nothing(cluster):
    client = client_for(UserFactory())
    post(client, JOB, "k1")
    other = post(client, {**JOB, "num_gpus": 2}, "k1")
    assert other.status_code == 422
    assert "Idempotency-Key “k1” was used for another request" in other.json()["detail"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_keys_are_per_user_and_without_a_key_every_post_is_a_submission(cluster):
    alice, bob = client_for(UserFactory()), client_for(UserFactory())
    assert post(alice, JOB, "k1").json()["id"] != post(bob, JOB, "k1").json()["id"]
    post(alice, JOB)
    post(alice, JOB)
    assert Job.objects.count() == 4


@pytest.mark.django_db
def test_an_array_is_replayed_whole(cluster):
    client = client_for(UserFactory())
    first = post(client, {**JOB, "array": "0-3"}, "sweep")
    again = post(client, {**JOB, "array": "0-3"}, "sweep")
    assert again.status_code == 201 and again.json()["array_job_ids"] == first.json()["array_job_ids"]
    assert Job.objects.count() == 4


@pytest.mark.django_db
def test_a_refused_request_does_not_use_up_its_key(cluster):
    client = client_for(UserFactory())
    refused = post(client, {**JOB, "workload": "nope"}, "k1")
    assert refused.status_code == 400 and not IdempotencyKey.objects.exists()
    # The user fixes the request and sends it with the same key: it runs (Stripe does the same).
    assert post(client, JOB, "k1").status_code == 201
    assert Job.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "has space", "é", "x" * 256, "tab\tkey"])
def test_a_malformed_key_is_a_400_naming_the_header(cluster, key):
    answer = post(client_for(UserFactory()), JOB, key)
    assert answer.status_code == 400 and "Idempotency-Key" in answer.json()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_an_expired_key_submits_again_and_the_hourly_prune_deletes_it(cluster):
    client = client_for(UserFactory())
    first = post(client, JOB, "k1")
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))
    again = post(client, JOB, "k1")
    assert again.status_code == 201 and again.json()["id"] != first.json()["id"]
    assert IdempotencyKey.objects.get().job_id == again.json()["id"]
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))
    post(client, JOB, "k2")
    assert idempotency_keys_prune() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["k2"]


@pytest.mark.django_db
def test_the_schema_declares_the_header_and_its_answers(client):
    operation = client.get("/api/schema/?format=json").json()["paths"]["/api/v1/jobs/"]["post"]
    (header,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["in"] == "header" and not header.get("required")
    assert header["schema"]["maxLength"] == 255 and header["schema"]["pattern"] == "^[!-~]{1,255}$"
    assert {"201", "409", "422"} <= set(operation["responses"])


# Two connections at once, on PostgreSQL: the second INSERT of the key waits on the unique index.


def _concurrently(user, delay_s: float, monkeypatch) -> list:
    """Two POSTs with one key from two threads (two connections); the first one's submission is slowed
    by `delay_s` inside its transaction, after its job is created, so the second arrives meanwhile."""
    submitted = threading.Event()
    submit = views.job_submit

    def slow_submit(**kwargs):
        jobs = submit(**kwargs)
        if not submitted.is_set():
            submitted.set()
            time.sleep(delay_s)
        return jobs

    monkeypatch.setattr(views, "job_submit", slow_submit)
    answers: list = [None, None]

    def send(i: int) -> None:
        try:
            if i == 1:
                submitted.wait(10)
            answers[i] = post(client_for(user), JOB, "same-key")
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_with_one_key_make_one_job_the_second_waiting_for_the_first(cluster, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the concurrent case is PostgreSQL's (SQLite serialises writers)")
    first, second = _concurrently(UserFactory(), 1.0, monkeypatch)
    assert first.status_code == second.status_code == 201
    assert second.json() == first.json() and second["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1 and IdempotencyKey.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_retry_while_the_first_runs_too_long_is_a_409_and_submits_nothing(cluster, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the concurrent case is PostgreSQL's (SQLite serialises writers)")
    monkeypatch.setattr(idempotency, "IN_PROGRESS_WAIT_S", 1)
    first, second = _concurrently(UserFactory(), 3.0, monkeypatch)
    assert first.status_code == 201
    assert second.status_code == 409 and "in progress" in second.json()["detail"]
    assert Job.objects.count() == 1
