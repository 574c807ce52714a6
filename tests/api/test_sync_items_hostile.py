"""A sync's items from a buggy or hostile agent (issue 34, item 7): any malformed report, not an object
included, is rejected alone while the rest of the sync proceeds; a sample lists at most
MAX_GPUS_PER_SERVER GPUs, beyond which the sync is a clear 400 that stores nothing."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from cluster_app.models import GpuUsageSample, UsageSample
from scheduler_app.api.serializers.agents import MAX_GPUS_PER_SERVER
from scheduler_app.models import AgentReport, Job, JobState
from tests.api.agent_native import agent_path  # noqa: F401  (the fixture)
from tests.api.helpers import SYNC, lease_of, sync, synced, usage_sample

# Every hostile item through both of the image's paths: Django's and config/agent_calls.py first.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("agent_path")]


def started(lease, seq: int = 1) -> dict:
    return {
        "lease_id": str(lease),
        "seq": seq,
        "kind": "started",
        "at": timezone.now().isoformat(),
        "data": {},
    }


NOT_OBJECTS = [5, "x", None, [], True, 1.5]


def test_items_that_are_not_objects_are_rejected_alone_and_the_rest_proceeds(agent, server, running):
    lease = lease_of(running).lease_id
    body = synced(agent, reports=[*NOT_OBJECTS, started(lease)], running=[lease])
    assert body["acked"] == [[str(lease), 1]]
    assert len(body["rejected"]) == len(NOT_OBJECTS)
    for rejection, item in zip(body["rejected"], NOT_OBJECTS, strict=True):
        assert rejection["code"] == 400 and rejection["lease_id"] is None and rejection["seq"] is None
        assert rejection["error"].startswith("a report must be a JSON object, not "), (item, rejection)
    assert "not null" in body["rejected"][2]["error"] and "not int" in body["rejected"][0]["error"]
    assert Job.objects.get(pk=running.pk).state == JobState.RUNNING
    assert AgentReport.objects.filter(lease_id=lease).count() == 1  # the good one, applied
    assert UsageSample.objects.filter(server=server).count() == 1  # and the sample stored


@pytest.mark.parametrize(
    "item, names",
    [
        ({}, ["lease_id", "seq", "kind", "at"]),
        ({"lease_id": "not-a-uuid", "seq": 2, "kind": "log", "at": "2026-11-21T12:00:00Z"}, ["lease_id"]),
        ({"lease_id": {"a": 1}, "seq": "2", "kind": "log", "at": 5, "data": 7}, ["lease_id", "seq", "at"]),
        ({"seq": 2, "kind": "nope", "at": "yesterday"}, ["lease_id", "kind", "at"]),
    ],
)
def test_objects_missing_or_mangling_fields_are_rejected_alone(agent, running, item, names):
    lease = lease_of(running).lease_id
    body = synced(agent, reports=[item, started(lease)], running=[lease])
    assert body["acked"] == [[str(lease), 1]]
    (rejection,) = body["rejected"]
    assert rejection["code"] == 400
    assert all(name in rejection["error"] for name in names), rejection["error"]
    # What names a report the agent can drop is echoed; what cannot, is not.
    assert rejection["seq"] == (item["seq"] if type(item.get("seq")) is int else None)
    assert rejection["lease_id"] == (item["lease_id"] if isinstance(item.get("lease_id"), str) else None)


@pytest.mark.parametrize("reports", [{"lease_id": "x"}, "x", 5])
def test_reports_still_must_be_a_list(agent, reports):
    body = {"sample": usage_sample(), "running": [], "reports": reports}
    response = agent.post(SYNC, data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400 and "reports" in response.json()
    assert not UsageSample.objects.exists()


def gpus(n: int) -> list[dict]:
    return [{"uuid": f"GPU-{i}", "util_pct": 1.0, "mem_used_mb": 1.0} for i in range(n)]


def test_a_sample_listing_more_gpus_than_a_server_can_have_is_a_400_storing_nothing(agent, server):
    response = sync(agent, sample=usage_sample(gpus=gpus(10_000)))
    assert response.status_code == 400
    assert response.json() == {
        "sample": {
            "gpus": [
                f"a sample lists at most {MAX_GPUS_PER_SERVER} GPUs (a server registers at most as many)"
            ]
        }
    }
    assert not UsageSample.objects.exists() and not GpuUsageSample.objects.exists()


def test_a_sample_at_the_gpu_bound_is_accepted(agent, server):
    own = [{"uuid": g.uuid, "util_pct": 50.0, "mem_used_mb": 10.0} for g in server.gpus.all()]
    sample = usage_sample(gpus=own + gpus(MAX_GPUS_PER_SERVER - len(own)))
    assert synced(agent, sample=sample)["state"] == "IDLE"
    assert GpuUsageSample.objects.count() == len(own)  # GPUs not the server's are ignored, as always


def test_registration_lists_at_most_as_many_gpus(agent):
    inventory = {
        "num_cpus": 8,
        "mem_gb": 64.0,
        "gpus": [{"index": i, "uuid": f"GPU-{i}"} for i in range(MAX_GPUS_PER_SERVER + 1)],
    }
    response = agent.post("/api/v1/agent/register", inventory, format="json")
    assert response.status_code == 400 and "gpus" in response.json()
