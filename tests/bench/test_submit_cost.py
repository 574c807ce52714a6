"""bench.submit_cost's measuring loop: one CPU figure per accepted submission, a refusal stops it."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from bench.submit_cost import bodies, queries_of, submit_all
from scheduler_app.models import Job
from tests.api.helpers import make_server, workload

pytestmark = pytest.mark.django_db


def test_each_submission_is_stored_and_timed_and_a_refusal_stops_the_bench(user) -> None:
    make_server("gpu01", gpus=8, cpus=24, mem_gb=500)
    workload("res18")
    token = Token.objects.create(user=user).key
    batch = bodies(["res18"], 3, seed_=7)
    assert batch == bodies(["res18"], 3, seed_=7)  # the same submissions for the trees compared
    cpu_s = submit_all(Client(), token, batch[:2])
    assert len(cpu_s) == 2 and all(s > 0 for s in cpu_s)
    assert set(Job.objects.values_list("name", flat=True)) == {"cost-0", "cost-1"}
    assert queries_of(Client(), token, batch[2])  # its SQL, one statement a line
    with pytest.raises(RuntimeError, match="refused: 400"):
        submit_all(Client(), token, [{**batch[0], "workload": "nope"}])
