"""The submission form: labels, server-side validation next to each field, typed values kept."""

import re

import pytest
from django.utils import timezone

from scheduler_app.models import Job, JobState
from scheduler_app.web.forms import JobSubmitForm
from tests.factories import TeamFactory

pytestmark = pytest.mark.django_db

URL = "/jobs/new/"


def field_errors(html: str, field: str) -> list[str]:
    """The error messages rendered right after `field`'s input (its .field block)."""
    block = re.search(rf'<div class="field[^"]*" id="field-{field}">(.*?)</div>', html, re.S)
    assert block, f"no block for {field}"
    return re.findall(r"<li>(.*?)</li>", block.group(1))


def test_every_field_has_a_label(user, client_of, cluster):
    html = client_of(user).get(URL).content.decode()
    form = JobSubmitForm(user=user)
    for name, field in form.fields.items():
        assert f'<label for="id_{name}">{field.label}</label>' in html, name
    assert '<option value="res18">res18</option>' in html


def test_a_catalog_job_is_queued_and_the_user_sent_to_its_page(
    user, client_of, cluster, no_rounds, django_capture_on_commit_callbacks
):
    team = TeamFactory(name="vision")
    team.members.add(user)
    deadline = (timezone.now() + timezone.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M")
    client = client_of(user)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            URL,
            {
                "name": "res18-a",
                "workload": "res18",
                "num_gpus": "2",
                "total_iters": "5000",
                "cpus_per_gpu": "4",
                "team": "vision",
                "qos_deadline_at": deadline,
            },
        )
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.owner, job.workload.name, job.num_gpus, job.total_iters) == (user, "res18", 2, 5000)
    assert job.cpus_per_gpu == 4.0 and job.mem_gb_per_gpu is None and job.team == team
    assert job.qos_deadline_at.strftime("%Y-%m-%dT%H:%M") == deadline
    assert job.state == JobState.PENDING
    assert job.events.get().kind == "submitted"
    # job_submit with admission, like the API: an early round is asked for once the submission commits.
    assert no_rounds == ["submit"]


def test_an_own_command_job_is_queued(user, client_of, cluster):
    response = client_of(user).post(
        URL, {"name": "mine", "command": "python train.py", "num_gpus": "1", "total_iters": "100"}
    )
    job = Job.objects.get()
    assert response.status_code == 302
    assert job.workload is None and job.command == "python train.py"


@pytest.mark.parametrize(
    ("data", "name"),
    [
        ({"workload": "res18", "total_iters": "10"}, "res18"),
        ({"command": "/usr/bin/python3 -u 'train it.py'"}, "python3"),
        ({"script": "#!/bin/bash\n#SBATCH --job-name=from-script\necho hi\n"}, "from-script"),
        ({"script": "#!/bin/bash\necho hi\n"}, "batch-script"),
        ({"name": " mine ", "command": "python train.py"}, "mine"),
    ],
)
def test_a_job_without_a_name_is_named_as_the_command_line_names_it(user, client_of, cluster, data, name):
    response = client_of(user).post(URL, {"num_gpus": "1", **data})
    assert response.status_code == 302, response.content.decode()
    assert Job.objects.get().name == name


def test_a_service_error_shows_next_to_its_field_and_keeps_what_was_typed(user, client_of, cluster):
    response = client_of(user).post(
        URL,
        {
            "name": "too-big",
            "workload": "res18",
            "num_gpus": "64",
            "total_iters": "777",
            "mem_gb_per_gpu": "9",
        },
    )
    html = response.content.decode()
    assert response.status_code == 200 and not Job.objects.exists()
    assert field_errors(html, "num_gpus") == ["The cluster has only 4 GPUs."]
    assert field_errors(html, "total_iters") == []
    for name, value in [
        ("name", "too-big"),
        ("num_gpus", "64"),
        ("total_iters", "777"),
        ("mem_gb_per_gpu", "9"),
    ]:
        assert re.search(rf'name="{name}" value="{value}"', html), name
    assert '<option value="res18" selected>res18</option>' in html
    assert 'aria-invalid="true"' in html


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({}, "workload", "Choose a catalog workload, or give a command or a batch script to run."),
        ({"workload": "res18", "command": "x"}, "command", "not both"),
        (
            {"workload": "res18", "cpus_per_gpu": "0"},
            "cpus_per_gpu",
            "CPU cores per GPU must be at least 0.01.",
        ),
        (
            {"workload": "res18", "mem_gb_per_gpu": "-1"},
            "mem_gb_per_gpu",
            "Memory per GPU (GB) must be at least 0.01.",
        ),
        ({"workload": "res18", "num_gpus": "0"}, "num_gpus", "greater than or equal to 1"),
        ({"workload": "res18", "total_iters": "abc"}, "total_iters", "Enter a whole number."),
        (
            {"workload": "res18", "qos_deadline_at": "2030-01-01T10:00", "qos_max_latency_s": "60"},
            "qos_max_latency_s",
            "Give either a deadline or a maximum latency, not both.",
        ),
        ({"workload": "res18", "qos_max_latency_s": "0.5s"}, "qos_max_latency_s", "from 1 second"),
        (
            {"workload": "res18", "qos_max_latency_s": "-5"},
            "qos_max_latency_s",
            "The maximum latency takes MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or 30m, 6h, 1h30m, "
            "3h30, 2d): &#x27;-5&#x27; is not a duration",
        ),
        ({"workload": "res18", "time_limit": "soon"}, "time_limit", "The time limit takes MM, MM:SS"),
        ({"workload": "res18", "time_limit": "UNLIMITED"}, "time_limit", "leave it empty for none"),
        ({"workload": "res18", "time_limit": "1-24:00"}, "time_limit", "hours must be 0-23"),
        ({"workload": "res18", "team": "other"}, "team", "Select a valid choice"),
        ({"workload": "nope"}, "workload", "Select a valid choice"),
    ],
)
def test_validation_errors_are_placed_on_their_field(user, client_of, cluster, data, field, message):
    TeamFactory(name="other")  # exists, but the user is no member: not offered, refused if forced
    body = {"name": "j", "num_gpus": "1", "total_iters": "10", **data}
    html = client_of(user).post(URL, body).content.decode()
    assert not Job.objects.exists()
    assert any(message in e for e in field_errors(html, field)), field_errors(html, field)


def test_the_team_list_offers_only_the_users_teams(user, client_of, cluster):
    TeamFactory(name="other")
    mine = TeamFactory(name="mine")
    mine.members.add(user)
    html = client_of(user).get(URL).content.decode()
    assert '<option value="mine">mine</option>' in html and "other" not in html


def test_a_service_error_on_an_unknown_field_goes_above_the_form(user):
    from django.core.exceptions import ValidationError

    form = JobSubmitForm({"name": "j", "num_gpus": "1", "total_iters": "1", "command": "x"}, user=user)
    assert form.is_valid()
    form.add_service_errors(ValidationError({"priority": ["Nope."], "num_gpus": ["Too many."]}))
    assert form.non_field_errors() == ["Nope."] and form.errors["num_gpus"] == ["Too many."]


def test_after_jobs_takes_ids_separated_as_users_type_them_and_is_shown_on_the_job_page(
    user, client_of, cluster, no_rounds
):
    client = client_of(user)
    base = {"workload": "res18", "num_gpus": "1", "total_iters": "100"}
    first = client.post(URL, {**base, "name": "prep"})["Location"]
    second = client.post(URL, {**base, "name": "prep2"})["Location"]
    ids = [int(u.strip("/").rsplit("/", 1)[-1]) for u in (first, second)]
    for typed in (f"{ids[0]}, {ids[1]}", f"afterok:{ids[0]}:{ids[1]}", f" {ids[0]}  {ids[1]} "):
        response = client.post(URL, {**base, "name": "train", "depends_on": typed})
        assert response.status_code == 302, typed
        job = Job.objects.get(pk=int(response["Location"].strip("/").rsplit("/", 1)[-1]))
        assert sorted(job.depends_on.values_list("pk", flat=True)) == ids, typed
    html = client.get(response["Location"]).content.decode()
    deps = re.search(r'<dd id="depends-on">(.*?)</dd>', html, re.S).group(1)
    assert f'<a href="/jobs/{ids[0]}/">{ids[0]}</a>' in deps and "PENDING" in deps
    assert "Dependency" in html  # its pending reason


def test_after_jobs_rejects_what_is_not_a_job_id_and_keeps_the_form(user, client_of, cluster):
    response = client_of(user).post(
        URL,
        {"name": "train", "workload": "res18", "num_gpus": "1", "total_iters": "100", "depends_on": "12, x"},
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert field_errors(html, "depends_on") == ["“x” is not a job id: give job numbers, e.g. 12, 13."]
    assert 'value="12, x"' in html and not Job.objects.exists()
    response = client_of(user).post(
        URL,
        {"name": "train", "workload": "res18", "num_gpus": "1", "total_iters": "100", "depends_on": "777"},
    )
    assert field_errors(response.content.decode(), "depends_on") == ["No job 777 that you can see."]


def test_an_array_from_the_form_is_one_job_per_task(user, client_of, cluster, no_rounds):
    client = client_of(user)
    base = {"name": "sweep", "workload": "res18", "num_gpus": "1", "total_iters": "100"}
    response = client.post(URL, {**base, "array": "1,3,5"}, follow=True)
    tasks = list(Job.objects.order_by("array_task_id"))
    assert [t.array_task_id for t in tasks] == [1, 3, 5] and {t.array_job_id for t in tasks} == {tasks[0].pk}
    html = response.content.decode()
    assert f"Array of 3 tasks submitted: jobs {tasks[0].pk} to {tasks[2].pk}." in html
    assert '<dd id="array-task">1 of array' in html and f"Job {tasks[0].pk}: sweep[1] " in html
    queue = client.get(f"/jobs/?array_job={tasks[0].pk}").content.decode()
    assert all(f">sweep[{t.array_task_id}]</a>" in queue for t in tasks)
    response = client.post(URL, {**base, "array": "9-1"})
    assert field_errors(response.content.decode(), "array") == ["“9-1” is an empty range"]
    assert Job.objects.count() == 3
    response = client.post(URL, {**base, "array": "0-3%2"}, follow=True)
    assert '<dd id="array-task">0 of array' in response.content.decode()
    assert "at most 2 tasks at once" in response.content.decode()
    assert Job.objects.filter(array_task_limit=2).count() == 4
    # The job page changes the array's limit for every task (scontrol update ArrayTaskThrottle=).
    task = Job.objects.filter(array_task_limit=2).order_by("array_task_id").last()
    assert 'name="array_task_limit"' in client.get(f"/jobs/{task.pk}/").content.decode()
    html = client.post(f"/jobs/{task.pk}/update/", {"array_task_limit": "3"}, follow=True).content.decode()
    assert f"Job {task.pk} updated." in html and "at most 3 tasks at once" in html
    assert Job.objects.filter(array_task_limit=3).count() == 4


@pytest.mark.parametrize(
    ("typed", "seconds"),
    [("90m", 5400), ("6h", 21600), ("1-12:00", 129600), ("30", 1800), ("01:30:00", 5400), ("1h30m", 5400)],
)
def test_the_time_limit_and_the_latency_take_the_command_lines_durations(
    user, client_of, cluster, typed, seconds
):
    response = client_of(user).post(
        URL,
        {"name": "t", "command": "python train.py", "time_limit": typed, "qos_max_latency_s": typed},
    )
    job = Job.objects.get()
    assert response.status_code == 302
    # An own command needs no iterations: its time limit sizes it.
    assert (job.time_limit_s, job.qos_max_latency_s, job.total_iters) == (seconds, seconds, None)


def test_a_job_is_submitted_held_on_given_servers(user, client_of, cluster, no_rounds):
    from tests.api.helpers import make_server

    make_server("gpu02", gpus=4, cpus=12, mem_gb=250)
    html = client_of(user).get(URL).content.decode()
    assert 'type="checkbox" name="hold"' in html and 'name="num_nodes"' in html
    response = client_of(user).post(
        URL,
        {"name": "later", "command": "torchrun train.py", "num_gpus": "4", "num_nodes": "2", "hold": "on"},
    )
    job = Job.objects.get()
    assert response.status_code == 302
    assert job.held and job.pending_reason == "JobHeldUser" and (job.num_gpus, job.num_nodes) == (4, 2)


def test_a_scripts_hold_directive_holds_it_though_the_box_is_unticked(user, client_of, cluster):
    client = client_of(user)
    client.post(URL, {"script": "#!/bin/bash\n#SBATCH --job-name=held --hold\n#SBATCH -t 1-00:00\ntrue\n"})
    client.post(URL, {"script": "#!/bin/bash\n#SBATCH --job-name=free\ntrue\n"})
    held, free = Job.objects.get(name="held"), Job.objects.get(name="free")
    assert held.held and held.time_limit_s == 86400 and not free.held


def test_a_refused_duration_keeps_what_was_typed(user, client_of, cluster):
    html = (
        client_of(user)
        .post(
            URL,
            {
                "name": "j",
                "workload": "res18",
                "total_iters": "10",
                "time_limit": "soon",
                "qos_max_latency_s": "6h",
            },
        )
        .content.decode()
    )
    assert 'name="time_limit" value="soon"' in html and 'name="qos_max_latency_s" value="6h"' in html
