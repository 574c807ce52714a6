"""A common submission checked by hand (job_request_plain) is the request the serializer would make of
it; anything it is not sure of goes to the serializer, which says what is wrong."""

import random
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from scheduler_app.api.serializers.job_submit import JobSubmitSerializer, job_request_plain
from tests.api.helpers import workload

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


def by_serializer(body, user):
    serializer = JobSubmitSerializer(data=body, context={"request": SimpleNamespace(user=user)})
    return serializer.to_request() if serializer.is_valid() else None


NAMES = ["sweep-1", "  padded  ", "é lr=0.1", "x" * 200]
BAD_NAMES = ["", "   ", "x" * 201, "a\x00b", "tab\there", "\ud800", 7, None]
WHOLE = [1, 2, 8, 32767, 10**12]
BAD_WHOLE = [0, -1, 2.0, 2.5, True, "2", None, 32768, 10**12 + 1]
# Field -> (values the serializer takes, values it refuses or reads otherwise).
POOLS = {
    "name": (NAMES, BAD_NAMES),
    "workload": (["res18"], ["nope", "", "res\x0018", 3, None, ["res18"]]),
    "num_gpus": (WHOLE[:4], BAD_WHOLE),
    "total_iters": (WHOLE, BAD_WHOLE),
    "priority": ([0, -5, -100], [-101, 1, 100, 0.0, False, "0", None]),
    "hold": ([True, False], ["true", 1, None]),
    "array": (["0-2", ""], []),
    "nodes": ([1], [0]),
}
OPTIONAL = {"num_gpus": 0.6, "total_iters": 0.8, "priority": 0.3, "hold": 0.3, "array": 0.1, "nodes": 0.1}


def bodies(count: int, seed: int):
    """Bodies mostly well-formed, each field now and then one the serializer refuses or reads otherwise."""
    rng = random.Random(seed)
    for _ in range(count):
        body = {}
        for key, (good, bad) in POOLS.items():
            if rng.random() < OPTIONAL.get(key, 0.97):
                body[key] = rng.choice(bad if bad and rng.random() < 0.15 else good)
        yield body


def test_a_plain_submission_is_the_serializers_request_and_the_rest_goes_to_it(user):
    workload("res18")
    plain_seen = refused_seen = 0
    for body in bodies(400, seed=37):
        expected = by_serializer(body, user)
        got = job_request_plain(body)
        if got is not None:
            plain_seen += 1
            assert got == expected, body
        elif expected is None:
            refused_seen += 1
    assert plain_seen > 50 and refused_seen > 50  # both ways were taken


@pytest.mark.parametrize(
    "body",
    [
        {"name": "one", "workload": "res18"},
        {"name": "  two ", "workload": "res18", "num_gpus": 4, "total_iters": 10**12, "priority": -3},
        {"name": "held", "workload": "res18", "total_iters": 5, "hold": True, "priority": 0},
    ],
)
def test_the_common_submissions_are_checked_by_hand(user, body):
    workload("res18")
    got = job_request_plain(body)
    assert got is not None and got == by_serializer(body, user)


@pytest.mark.parametrize(
    "body",
    [
        {"name": "up", "workload": "res18", "priority": 1},  # staff only: the serializer knows who asks
        {"name": "x", "workload": "unknown"},  # the serializer names the workloads there are
        {"name": "x", "workload": "res18", "array": "0-3"},
        {"name": "x", "workload": "res18", "num_gpus": 2.0},  # a whole float: the serializer reads it
    ],
)
def test_what_it_is_not_sure_of_goes_to_the_serializer(user, body):
    workload("res18")
    assert job_request_plain(body) is None


def test_bad_input_gets_the_serializers_errors_through_the_api(user):
    workload("res18")
    client = APIClient()
    client.force_authenticate(user)
    response = client.post(JOBS, {"name": "   ", "workload": "res18", "num_gpus": True}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"name", "num_gpus"}
    response = client.post(JOBS, {"name": "x", "workload": "nope"}, format="json")
    assert response.status_code == 400 and "Unknown" in response.json()["workload"][0]


def test_the_capacity_a_submission_checks_is_the_clusters(db):
    from cluster_app.selectors import cluster_capacity
    from scheduler_app.services.job_requests import cluster_gpus_capacity
    from tests.api.helpers import make_server

    wanted = ("servers", "gpus", "largest_server_gpus")
    assert cluster_gpus_capacity() == {k: cluster_capacity()[k] for k in wanted} == dict.fromkeys(wanted, 0)
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    make_server("gpu02", gpus=8, cpus=12, mem_gb=250)
    assert cluster_gpus_capacity() == {k: cluster_capacity()[k] for k in wanted}
    assert cluster_gpus_capacity() == {"servers": 2, "gpus": 12, "largest_server_gpus": 8}
