"""Cluster overview, staff-only drain/resume, and the OpenAPI schema and its Swagger UI."""

import pytest
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from cluster_app.models import NodeState, Server
from scheduler_app.models import Job, JobState
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import lease_of, make_server, submit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def scheduler(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
    }


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_cluster_overview_shows_capacity_and_use(user):
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    make_server("gpu02", gpus=2, cpus=6, mem_gb=100, state=NodeState.DOWN)
    job = submit(user, gpus=2)
    scheduling_round_run()
    lease = lease_of(job)

    body = client_for(user).get("/api/v1/cluster/").json()

    assert body["totals"] == {
        "servers": 2,
        "gpus": 6,
        "cpus": 18,
        "mem_gb": 350.0,
        "gpus_in_use": 2,
        "cpus_in_use": lease.num_cpus,
        "mem_gb_in_use": lease.mem_gb,
        "schedulable_gpus": 4,
    }
    gpu01, gpu02 = body["servers"]
    assert gpu01["name"] == "gpu01" and gpu01["state"] == "MIXED"
    assert gpu01["capacity"] == {"gpus": 4, "cpus": 12, "mem_gb": 250.0}
    assert gpu01["in_use"] == {"gpus": 2, "cpus": lease.num_cpus, "mem_gb": lease.mem_gb}
    assert [g["busy"] for g in gpu01["gpus"]] == [True, True, False, False]
    assert gpu01["gpus"][0]["job_id"] == job.pk
    assert gpu02["state"] == "DOWN" and gpu02["in_use"]["gpus"] == 0


def test_drain_and_resume_are_staff_only(user):
    make_server("gpu01")
    client = client_for(user)
    assert client.post("/api/v1/servers/gpu01/drain/").status_code == 403
    assert client.post("/api/v1/servers/gpu01/resume/").status_code == 403
    assert Server.objects.get().state == NodeState.IDLE


def test_drain_a_busy_server_then_it_drains_when_empty_and_resumes(staff_user, user):
    server = make_server("gpu01", gpus=2, cpus=6, mem_gb=100)
    job = submit(user, gpus=1)
    scheduling_round_run()
    client = client_for(staff_user)

    response = client.post("/api/v1/servers/gpu01/drain/", {"reason": "new PSU"}, format="json")
    assert response.status_code == 200
    assert response.json() == {"name": "gpu01", "state": "DRAINING", "state_reason": "new PSU"}
    newcomer = submit(user, gpus=1, name="newcomer")
    scheduling_round_run()
    newcomer.refresh_from_db()
    assert newcomer.state == JobState.PENDING  # nothing new is placed on a draining server
    assert lease_of(job).server == server  # the running job finishes where it is

    job_finish(job=Job.objects.get(pk=job.pk), state=JobState.COMPLETED)
    scheduling_round_run()
    server.refresh_from_db()
    assert server.state == NodeState.DRAINED

    response = client.post("/api/v1/servers/gpu01/resume/")
    assert response.json()["state"] == "IDLE"
    scheduling_round_run()
    newcomer.refresh_from_db()
    assert newcomer.state == JobState.RUNNING


def test_draining_an_idle_server_is_drained_at_once(staff_user):
    make_server("gpu01")
    assert client_for(staff_user).post("/api/v1/servers/gpu01/drain/").json()["state"] == "DRAINED"


def test_a_down_server_cannot_be_resumed_or_drained(staff_user):
    make_server("gpu01", state=NodeState.DOWN)
    client = client_for(staff_user)
    assert client.post("/api/v1/servers/gpu01/resume/").status_code == 409
    assert client.post("/api/v1/servers/gpu01/drain/").status_code == 409


def test_an_unknown_server_is_not_found(staff_user):
    assert client_for(staff_user).post("/api/v1/servers/nope/drain/").status_code == 404


def test_the_schema_is_valid_openapi_and_lists_every_endpoint():
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    validate_schema(schema)
    assert schema["openapi"].startswith("3.")
    assert {
        "/api/v1/agent/register",
        "/api/v1/agent/sync",
        "/api/v1/jobs/",
        "/api/v1/jobs/{id}/",
        "/api/v1/jobs/{id}/cancel/",
        "/api/v1/cluster/",
        "/api/v1/servers/{name}/drain/",
        "/api/v1/servers/{name}/resume/",
    } <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["agentToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The server's agent token (node_token).",
    }


def test_swagger_ui_is_served_without_a_cdn(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "swagger-ui" in body and "cdn.jsdelivr" not in body and "unpkg" not in body
    asset = "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js"
    assert asset in body
    served = client.get(asset)
    assert served.status_code == 200
    assert b"".join(served.streaming_content if served.streaming else [served.content])


def test_the_schema_documents_each_operations_errors_with_their_bodies():
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    validate_schema(schema)
    submit = schema["paths"]["/api/v1/jobs/"]["post"]["responses"]
    assert {"201", "400", "401", "403", "413"} <= set(submit)
    field_errors = {"$ref": "#/components/schemas/FieldErrors"}
    assert submit["400"]["content"]["application/json"]["schema"] == field_errors
    assert submit["401"]["headers"]["WWW-Authenticate"]["schema"]["example"] == "Token"
    detail = schema["paths"]["/api/v1/jobs/{id}/"]["get"]["responses"]
    assert "404" in detail and "400" not in detail  # no body, no query: nothing to be malformed
    assert {"404", "409"} <= set(schema["paths"]["/api/v1/jobs/{id}/cancel/"]["post"]["responses"])
    agent = schema["paths"]["/api/v1/agent/sync"]["post"]["responses"]
    assert {"200", "400", "401", "413"} <= set(agent)  # a malformed sample or running list is a 400
    assert agent["400"]["content"]["application/json"]["schema"] == field_errors
    assert agent["401"]["headers"]["WWW-Authenticate"]["schema"]["example"] == "Bearer"
    assert schema["components"]["schemas"]["ErrorDetail"]["required"] == ["detail"]
