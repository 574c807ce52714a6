"""The API against its own schema: schemathesis sends generated requests to every operation.

Valid and invalid requests (schemathesis's positive and negative modes, its boundary-value coverage
phase included), with a fixed seed (derandomize) and a bounded number of examples per operation, so
that the run is the same each time and fits the suite. Users' operations run with a staff user's
token, the agent protocol's (register and sync) with a node's Bearer token. Every response is
checked: no 5xx, a documented status code, content type and headers, a body that matches the schema,
no request that breaks the schema accepted (negative_data_rejection), and no request the schema allows
refused (positive_data_acceptance) for anything but what a schema cannot state: names and ids only the
database knows (an unknown workload or team), rules across fields, what this cluster's servers can
hold, a deadline's distance from now, a login's credentials (REFUSALS_THE_SCHEMA_CANNOT_STATE, each by
its field and message). A pattern or limit the server applies and the schema does not state fails it.
The agents' long-poll, GET /api/v1/agent/wait, is not a Django view and not in the schema
(config/agent_wait.py, served by config/asgi.py): tests/cluster_app/test_agent_wake.py covers it.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from rest_framework.authtoken.models import Token
from schemathesis.core.failures import Failure
from schemathesis.specs.openapi.checks import positive_data_acceptance

from cluster_app.services import agent_credential_issue
from scheduler_app.services.idempotency import IDEMPOTENCY_KEY_PATTERN
from tests.api.helpers import make_server, workload
from tests.factories import UserFactory

MIN_CASES = 1000
EXAMPLES_PER_OPERATION = 60

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
cases_sent: Counter[str] = Counter()

# Field (or detail) -> the start of each message refusing what the schema cannot state.
REFUSALS_THE_SCHEMA_CANNOT_STATE: dict[str, tuple[str, ...]] = {
    "workload": ("Unknown workload ",),  # the catalog's names
    "team": ("Unknown team ", "You are not a member of team "),
    "depends_on": ("No job ", "Job "),  # ids of jobs the user can see; "Job 7 ended CANCELLED: ..."
    # What this cluster's servers can hold.
    "num_gpus": ("The cluster has only ",),
    "nodes": ("No server has ", "The cluster has only ", " GPUs do not split evenly", " GPUs per server: "),
    "cpus_per_gpu": ("No server offers ",),
    "mem_gb_per_gpu": ("No server offers ",),
    # Rules across fields.
    "chdir": ("Give an absolute path, or submit from a directory",),  # relative needs submit_dir
    "qos_max_latency_s": ("Give either a deadline or a maximum latency",),
    "qos_min_rate_iters_per_s": ("Give one QoS target",),
    # numbers' order, and a limit's range
    "array": (
        "is an empty range",
        "task indices go up to ",
        "an array has at most ",
        "a limit on simultaneous tasks (%N) is from 1 to ",
    ),
    "qos_deadline_at": ("A deadline is at most ",),  # from now
    "array_task_limit": (" is not a task of an array",),  # the job's
    "start": ("Give start with end", "Give a window of at most "),
    "end": ("Give an end after start",),
    "window": ("Give a window, or start (and end), not both",),
    "non_field_errors": ("Unable to log in with provided credentials",),
}


def _messages(body, field: str = ""):
    """(field, message) for every message of a DRF error body, nested fields under their top field."""
    if isinstance(body, dict):
        for key, value in body.items():
            yield from _messages(value, field or key)
    elif isinstance(body, list):
        for item in body:
            yield from _messages(item, field)
    else:
        yield field, str(body)


def _refused_for_what_the_schema_cannot_state(response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    found = list(_messages(body))
    return bool(found) and all(
        any(pattern in message for pattern in REFUSALS_THE_SCHEMA_CANNOT_STATE.get(field, ()))
        for field, message in found
    )


def schema_valid_requests_are_accepted(ctx, response, case):
    """positive_data_acceptance, save the refusals the schema cannot state."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except Failure:
        if _refused_for_what_the_schema_cannot_state(response):
            return None
        raise


@pytest.fixture
def credentials(db):
    """A staff user's token, a registered server's agent token, and a workload to submit to."""
    # The WSGI handler closes the database connection after each request, which would end the
    # test's transaction; Django's own test client disconnects these handlers the same way.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    staff = UserFactory(is_staff=True, is_superuser=True)
    server = make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    yield {
        "user": f"Token {Token.objects.create(user=staff).key}",
        "agent": f"Bearer {agent_credential_issue(server=server)}",
    }
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # the credentials are the same for every example
    ],
)
def test_every_operation_answers_as_its_schema_says(case, credentials):
    who = "agent" if case.path.startswith("/api/v1/agent/") else "user"
    cases_sent[case.operation.label] += 1  # also counts its unsupported-method probes
    key = (case.headers or {}).get("Idempotency-Key")
    if key is not None and re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key):
        # The fuzzing draws few distinct keys ("0" again and again): reused with another body, each
        # would be a 422 before its body is read. A fresh well-formed key keeps every body checked;
        # malformed ones are kept (each must be a 400). Replays: tests/api/test_idempotency_api.py.
        case.headers["Idempotency-Key"] = str(uuid.uuid4())
    if "name" in (case.path_parameters or {}):
        # A server that exists: a drain's body is read only once its server is found (a random name
        # is a 404 before that, and a body the schema refuses would go unnoticed).
        case.path_parameters["name"] = "gpu01"
    if who == "agent":
        # The agents' serializers are checked for everything but acceptance (not stated there yet).
        case.call_and_validate(
            headers={"Authorization": credentials[who]}, excluded_checks=[positive_data_acceptance]
        )
        return
    case.call_and_validate(
        headers={"Authorization": credentials[who]},
        excluded_checks=[positive_data_acceptance],
        additional_checks=[schema_valid_requests_are_accepted],
    )


def test_the_fuzzing_sent_at_least_1000_cases_and_reached_every_operation():
    if not cases_sent:
        pytest.skip("the fuzzing test did not run in this session (run the whole module)")
    operations = {result.ok().label for result in schema.get_all_operations()}
    assert set(cases_sent) == operations
    # The agent protocol is two calls: the one-time register and the periodic sync.
    assert {op for op in operations if "/agent/" in op} == {
        "POST /api/v1/agent/register",
        "POST /api/v1/agent/sync",
    }
    print(f"schemathesis sent {sum(cases_sent.values())} cases: {dict(cases_sent)}")
    assert sum(cases_sent.values()) >= MIN_CASES, cases_sent
