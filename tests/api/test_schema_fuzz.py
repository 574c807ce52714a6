"""The API against its own schema: schemathesis sends generated requests to every operation.

Valid and invalid requests (schemathesis's positive and negative modes, its boundary-value coverage
phase included), with a fixed seed (derandomize) and a bounded number of examples per operation, so
that the run is the same each time and fits the suite. Users' operations run with a staff user's
token, the agent protocol's (register and sync) with a node's Bearer token. Every response is
checked: no 5xx, a documented status code, content type and headers, a body that matches the schema,
and no request that breaks the schema accepted (negative_data_rejection). The one check left out is
positive_data_acceptance: a request the schema allows may still be refused for a reason only the
database knows (an unknown workload or team, a job no server can hold, a wrong password), and that is
a 400 by design. The agents' long-poll, GET /api/v1/agent/wait, is not a Django view and not in the
schema (config/agent_wait.py, served by config/asgi.py): tests/cluster_app/test_agent_wake.py covers it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings
from rest_framework.authtoken.models import Token
from schemathesis.specs.openapi.checks import positive_data_acceptance

from cluster_app.services import agent_credential_issue
from tests.api.helpers import make_server, workload
from tests.factories import UserFactory

MIN_CASES = 1000
EXAMPLES_PER_OPERATION = 60

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
cases_sent: Counter[str] = Counter()


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
    case.call_and_validate(
        headers={"Authorization": credentials[who]}, excluded_checks=[positive_data_acceptance]
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
