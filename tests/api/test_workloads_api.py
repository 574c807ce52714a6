"""GET /api/v1/workloads/ (the catalog with its profiles' summaries) and unknown names answered with
the names there are."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.factories import TeamFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_the_catalog_lists_each_workload_with_its_profile_or_null(client):
    WorkloadFactory(name="res18", description="ResNet-18 on ImageNet", speed_correction=0.5)
    WorkloadFactory(name="mine", tput_matrix=[], workload_class="other")
    response = client.get("/api/v1/workloads/")
    assert response.status_code == 200 and response.data["count"] == 2
    mine, res18 = response.data["results"]
    assert mine == {
        "name": "mine",
        "workload_class": "other",
        "description": "",
        "batch_size": 0,
        "profile": None,
        "genie": None,  # no GENIE profiling run has fitted it (tests/profiles_app/test_genie_profiling.py)
    }
    res18_row = WorkloadFactory(name="res18")
    assert res18["description"] == "ResNet-18 on ImageNet" and res18["profile"] == {
        # As every estimate of time uses it: divided by the speed correction learnt from finished jobs.
        "iter_time_s": res18_row.iter_time_s / 0.5,
        "best_cpus_per_gpu": 9.0,
        "best_mem_gb_per_gpu": 62.5,
        "speedup": 2.4,
        "placement_penalty": 1.0,
        "interference_kappa": 0.0,
    }


def test_the_catalog_needs_a_login():
    assert APIClient().get("/api/v1/workloads/").status_code == 401


def test_an_unknown_workload_or_team_is_answered_with_the_names_there_are(client):
    WorkloadFactory(name="res50")
    WorkloadFactory(name="res18")
    body = {"name": "j", "workload": "resnet", "total_iters": 10, "team": "nlp"}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert response.data["workload"] == ["Unknown workload “resnet”: choose one of res18, res50."]
    assert response.data["team"] == ["Unknown team “nlp”: there are none yet."]
    for k in range(25):
        TeamFactory(name=f"team{k:02}")
    response = client.post("/api/v1/jobs/", body, format="json")
    names = ", ".join(f"team{k:02}" for k in range(20))
    assert response.data["team"] == [f"Unknown team “nlp”: choose one of {names} and 5 more."]
