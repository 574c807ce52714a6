"""A job's checkpoint interval as users declare it: the REST API, `cli submit --checkpoint-every`, a batch
script's `#ATTUNE --checkpoint-every` and the web form; what is not a positive duration is refused."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from scheduler_app.models import Job
from tests.api.helpers import make_server, workload
from tests.cli.helpers import run

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


@pytest.fixture
def api(user) -> APIClient:
    make_server("gpu01", gpus=4)
    workload("res18")
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_api_stores_a_declared_interval_and_shows_it(api):
    body = {"name": "train", "command": "python train.py", "num_gpus": 1, "checkpoint_every_s": 600}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["checkpoint_every_s"] == 600.0
    assert Job.objects.get().checkpoint_every_s == 600.0
    # Not declared: null (a catalog workload's profile decides; an own command has none).
    response = api.post(
        JOBS, {"name": "r", "workload": "res18", "num_gpus": 1, "total_iters": 10}, format="json"
    )
    assert response.status_code == 201 and response.json()["checkpoint_every_s"] is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "The checkpoint interval is at least 1 second."),
        (-5, "The checkpoint interval is at least 1 second."),
        ("10m", "Give a number, not \u201c10m\u201d."),
        (10**9, "The checkpoint interval is at most 365 days."),
    ],
)
def test_the_api_refuses_what_is_not_a_positive_number_of_seconds(api, value, message):
    body = {"name": "train", "command": "python train.py", "num_gpus": 1, "checkpoint_every_s": value}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 400
    assert response.json()["checkpoint_every_s"] == [message]
    assert not Job.objects.exists()


def test_a_batch_scripts_directive_declares_it_and_the_request_wins(api):
    script = "#!/bin/bash\n#SBATCH --gpus=1\n#ATTUNE --checkpoint-every 10m\npython train.py\n"
    response = api.post(JOBS, {"name": "s", "script": script}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["checkpoint_every_s"] == 600.0
    response = api.post(JOBS, {"name": "t", "script": script, "checkpoint_every_s": 120}, format="json")
    assert response.json()["checkpoint_every_s"] == 120.0


def test_a_bad_directive_is_refused_with_its_line(api):
    script = "#!/bin/bash\n#SBATCH --gpus=1\n#ATTUNE --checkpoint-every soon\npython train.py\n"
    response = api.post(JOBS, {"name": "s", "script": script}, format="json")
    assert response.status_code == 400
    (error,) = response.json()["script"]
    assert error.startswith("line 3: #ATTUNE --checkpoint-every soon: --checkpoint-every takes"), error
    # The option is Attune's own: sbatch would refuse it on an #SBATCH line.
    script = "#!/bin/bash\n#SBATCH --checkpoint-every=10m\npython train.py\n"
    response = api.post(JOBS, {"name": "s", "script": script}, format="json")
    assert response.status_code == 400 and "put it on an #ATTUNE line" in response.json()["script"][0]


def test_the_command_line_declares_it_in_its_duration_syntax(
    live_server, user, tmp_path, monkeypatch, capsys
):
    make_server("gpu01", gpus=4)
    user.set_password("pw-for-a-test")
    user.save()
    monkeypatch.setenv("ATTUNE_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("ATTUNE_PASSWORD", "pw-for-a-test")
    monkeypatch.delenv("ATTUNE_TOKEN", raising=False)
    assert run(capsys, "--server", live_server.url, "login", "--username", user.username)[0] == 0
    code, out, err = run(
        capsys, "submit", "eval", "--command", "python eval.py", "--gpus", "1", "--checkpoint-every", "1h30m"
    )
    assert code == 0 and out.startswith("Submitted job"), err
    assert Job.objects.get(name="eval").checkpoint_every_s == 5400.0
    # Refused before anything is sent, with what was typed.
    code, _, err = run(capsys, "submit", "x", "--command", "python x.py", "--checkpoint-every", "0")
    assert code == 2 and "--checkpoint-every needs a positive duration" in err
    code, _, err = run(capsys, "submit", "x", "--command", "python x.py", "--checkpoint-every", "often")
    assert code == 2 and "--checkpoint-every takes" in err and "'often' is not a duration" in err
    assert Job.objects.count() == 1


def test_the_web_form_declares_it_and_says_what_is_wrong_beside_the_field(user, client):
    make_server("gpu01", gpus=4)
    client.force_login(user)
    form = {"name": "own", "command": "python train.py", "num_gpus": "1", "checkpoint_every": "15m"}
    response = client.post("/jobs/new/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Job.objects.get().checkpoint_every_s == 900.0
    response = client.post("/jobs/new/", {**form, "checkpoint_every": "never"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="field-checkpoint_every"' in html and "The checkpoint interval takes" in html
    assert Job.objects.count() == 1
