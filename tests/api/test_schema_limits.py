"""The schema's patterns and limits say what the server does: for each value, the schema's verdict and
the server's answer agree (the places schemathesis found them disagreeing, and their neighbours)."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from tests.api.helpers import make_server, submit, workload
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"
SCRIPT = {"script": "#!/bin/bash\necho hi\n", "num_gpus": 1}


@pytest.fixture
def staff() -> APIClient:
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    client = APIClient()
    client.force_authenticate(UserFactory(is_staff=True))
    return client


@pytest.fixture
def schema(staff) -> dict:
    return staff.get("/api/schema/?format=json").json()


def _property(schema: dict, variant: str, field: str) -> dict:
    return schema["components"]["schemas"][variant]["properties"][field]


def _allows(spec: dict, value: str) -> bool:
    pattern = spec.get("pattern")
    return (pattern is None or re.search(pattern, value) is not None) and len(value) <= spec.get(
        "maxLength", len(value)
    )


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("array", ["", "  ", "0-9", " 1,3,5-7 ", "0-15:4", "1,,2", ",", "a", "1%2", "1-", "3,\x1c4"]),
        ("array", ["0-99%4", "0-9 % 2 ", "1,3,%1", "%2", "0-9%", "0-9%a", "0-9%2%3", "0-9%-1", "0-9%\u0661"]),
        ("array", ["\u0661-\u0663"]),  # Arabic-Indic digits: Python's \d takes them, the pattern does not
        ("submit_dir", ["", "  ", "/home/a", " /home/a ", "home", " x/", "/a\x00b"]),
        ("output", ["", "log-%j.out", "%x-%A_%a.%n.out", "100%%", "a%", "%q", "%\n", "a\x00"]),
        ("name", ["x", "  x  ", "", "   ", "\x1c\u2028", "\ufeff", "a\x00", "n" * 200, "n" * 200 + " "]),
    ],
)
def test_the_schema_and_the_server_agree_on_each_value(staff, schema, field, values):
    spec = _property(schema, "JobSubmitScript", field)
    for value in values:
        answer = staff.post(JOBS, {**SCRIPT, "name": "probe", field: value}, format="json")
        accepted = answer.status_code == 201
        assert accepted == _allows(spec, value), (field, value, answer.json())


def test_a_script_named_by_a_blank_file_name_is_named_batch_script_and_a_null_name_is_refused(staff):
    answer = staff.post(JOBS, {**SCRIPT, "script_name": " \t"}, format="json")
    assert answer.status_code == 201 and answer.json()["name"] == "batch-script"
    answer = staff.post(JOBS, {**SCRIPT, "name": "", "script_name": "train.sh"}, format="json")
    assert answer.status_code == 201 and answer.json()["name"] == "train.sh"
    answer = staff.post(JOBS, {**SCRIPT, "name": None, "script_name": "train.sh"}, format="json")
    assert answer.status_code == 400 and "name" in answer.json()  # the schema: a string, not null


def test_the_minimum_rate_has_its_limits_in_the_schema(staff, schema):
    spec = _property(schema, "JobSubmitWorkload", "qos_min_rate_iters_per_s")
    assert (spec["minimum"], spec["maximum"]) == (1e-9, 1e9)
    body = {"name": "r", "workload": "res18", "total_iters": 10}
    for rate, ok in ((1e-9, True), (1e9, True), (0.0, False), (2e9, False)):
        answer = staff.post(JOBS, {**body, "qos_min_rate_iters_per_s": rate}, format="json")
        assert (answer.status_code == 201) == ok, (rate, answer.json())


def test_a_drain_reason_is_a_string_not_a_number(staff):
    answer = staff.post("/api/v1/servers/gpu01/drain/", {"reason": 0}, format="json")
    assert answer.status_code == 400 and "reason" in answer.json()
    assert staff.post("/api/v1/servers/gpu01/drain/", {"reason": "disk"}, format="json").status_code == 200


def test_the_id_list_pattern_is_what_the_filter_takes(staff, schema):
    (spec,) = [p["schema"] for p in schema["paths"][JOBS]["get"]["parameters"] if p["name"] == "id"]
    job = submit(UserFactory())
    for value in (
        f"{job.pk}",
        f"000{job.pk}",
        "1,2,3",
        "9" * 18,
        "0",
        "00",
        "9" * 19,
        "1," * 999 + "1",
        "1," * 1000 + "1",
        "1 ,2",
        "1\x00",
    ):
        answer = staff.get(JOBS, {"id": value})
        assert (answer.status_code == 200) == bool(re.search(spec["pattern"], value)), (value[:30], answer)
    assert [j["id"] for j in staff.get(JOBS, {"id": f"000{job.pk}"}).json()["results"]] == [job.pk]


@pytest.mark.parametrize("parameter", ["team", "owner", "workload", "name"])
def test_no_query_string_may_hold_a_nul(staff, schema, parameter):
    (spec,) = [p["schema"] for p in schema["paths"][JOBS]["get"]["parameters"] if p["name"] == parameter]
    assert re.search(spec["pattern"], "a\x00b") is None
    assert staff.get(JOBS, {parameter: "a\x00b"}).status_code == 400


def test_a_limit_of_any_length_is_served_capped_and_an_offset_past_its_maximum_refused(staff):
    assert staff.get(JOBS, {"limit": "9" * 40}).status_code == 200  # integer, minimum 1, no maximum
    assert staff.get("/api/v1/workloads/", {"limit": "0" * 50 + "5"}).status_code == 200
    answer = staff.get(JOBS, {"offset": "9" * 5000})
    assert answer.status_code == 400 and "offset" in answer.json()
