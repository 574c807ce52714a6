"""Own commands and batch scripts through the API: the account they run as, their files, their
directives, their node count, and what the agent is told to start (rendezvous included)."""

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler_app.models import Job, JobState, UnixAccount
from scheduler_app.selectors import agent_commands
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, agent_client, make_server, synced
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


@pytest.fixture(autouse=True)
def scheduler(fifo_tune):
    pass


@pytest.fixture
def two_servers():
    return [
        make_server("gpu01", gpus=4, cpus=12, mem_gb=250),
        make_server("gpu02", gpus=4, cpus=12, mem_gb=250),
    ]


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def post(user, **body):
    return client_for(user).post(JOBS, body, format="json")


def start_commands(server) -> list[dict]:
    return [c for c in agent_commands(server=server, running=[]) if c["kind"] == "start"]


def test_an_own_command_runs_as_the_owners_username(two_servers):
    alice = UserFactory(username="alice")
    answer = post(alice, name="mine", num_gpus=1, command="id -u")
    assert answer.status_code == 201, answer.content
    job = Job.objects.get(pk=answer.json()["id"])
    assert job.run_as == "alice" and job.total_iters is None  # --iters is optional for own commands
    scheduling_round_run()
    (start,) = start_commands(active(job)[0].server)
    assert start["run_as"] == "alice"
    assert start["argv"] == ["sh", "-c", "id -u"]
    assert start["stdout_path"] == f"attune-{job.pk}.out" and start["stderr_path"] == ""


def test_staff_can_map_a_user_to_another_account(two_servers):
    bob = UserFactory(username="bob@lab.example")
    UnixAccount.objects.create(user=bob, unix_user="bsmith")
    answer = post(bob, name="mine", num_gpus=1, command="true")
    assert answer.status_code == 201, answer.content
    assert Job.objects.get(pk=answer.json()["id"]).run_as == "bsmith"


def test_a_web_account_without_a_usable_unix_name_is_told_why_and_nothing_is_stored(two_servers):
    carol = UserFactory(username="carol@lab.example")
    answer = post(carol, name="mine", num_gpus=1, command="true")
    assert answer.status_code == 400
    assert "not a valid Unix account name" in str(answer.json()["run_as"])
    root = UserFactory(username="root")
    answer = post(root, name="mine", num_gpus=1, command="true")
    assert answer.status_code == 400 and "never run as root" in str(answer.json()["run_as"])
    assert not Job.objects.exists()


def test_a_catalog_workload_still_needs_its_iterations(two_servers):
    from tests.api.helpers import workload

    workload("res18")
    answer = post(UserFactory(), name="w", num_gpus=1, workload="res18")
    assert answer.status_code == 400 and "total_iters" in answer.json()


def test_a_command_and_a_script_together_are_refused(two_servers):
    answer = post(UserFactory(username="dave"), name="x", num_gpus=1, command="true", script="echo hi\n")
    assert answer.status_code == 400 and "not several" in str(answer.json())


SCRIPT = """#!/bin/bash
#SBATCH --job-name=ddp
#SBATCH --nodes=2 --gpus=4
#SBATCH --time=1:00:00
#SBATCH --output=%x-%j.log
#SBATCH --error=%x-%j.err
#SBATCH --chdir=/srv/work
#SBATCH --hold
#ATTUNE --iters 500
echo "rank $NODE_RANK of $NNODES"
"""


def test_a_script_s_directives_fill_the_fields_and_the_request_s_own_fields_win(two_servers):
    erin = UserFactory(username="erin")
    answer = post(erin, script=SCRIPT, time_limit_s=600)
    assert answer.status_code == 201, answer.content
    job = Job.objects.get(pk=answer.json()["id"])
    assert (job.name, job.num_gpus, job.num_nodes, job.total_iters) == ("ddp", 4, 2, 500)
    assert job.time_limit_s == 600  # given in the request: it wins over --time
    assert (job.output_path, job.error_path, job.work_dir) == ("%x-%j.log", "%x-%j.err", "/srv/work")
    assert job.held and job.script == SCRIPT and job.command == ""


def test_a_malformed_directive_names_its_line_and_nothing_is_stored(two_servers):
    answer = post(
        UserFactory(username="frank"), script="#!/bin/bash\n#SBATCH --job-name=a\n#SBATCH --gpus=abc\nrun\n"
    )
    assert answer.status_code == 400
    assert "line 3" in str(answer.json()["script"])
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        ({"num_gpus": 3, "nodes": 2}, "nodes", "do not split evenly"),
        ({"num_gpus": 6, "nodes": 3}, "nodes", "only 2 servers"),
        ({"num_gpus": 6}, "nodes", "ask for several servers"),
        ({"num_gpus": 1, "output": "out-%q.txt"}, "output", "Unknown pattern %q"),
        ({"num_gpus": 1, "chdir": "relative/dir"}, "chdir", "absolute path"),
    ],
)
def test_shapes_and_paths_that_cannot_work_are_refused_at_submission(two_servers, body, field, text):
    answer = post(UserFactory(username="gina"), name="x", command="true", **body)
    assert answer.status_code == 400
    assert text in str(answer.json()[field])


def test_a_two_node_job_gets_one_rendezvous_on_both_servers(two_servers):
    gpu01 = two_servers[0]
    gpu01.address = "10.0.0.1"
    gpu01.save()
    answer = post(
        UserFactory(username="hank"),
        script="#!/bin/bash\n#SBATCH --nodes=2 --gpus=4\ntorchrun x\n",
        name="ddp",
    )
    assert answer.status_code == 201, answer.content
    job = Job.objects.get(pk=answer.json()["id"])
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    parts = active(job)
    assert sorted(p.server.name for p in parts) == ["gpu01", "gpu02"]
    assert all(p.gpu_holds.count() == 2 for p in parts)
    starts = {s.name: start_commands(s)[0] for s in two_servers}
    envs = {name: start["env"] for name, start in starts.items()}
    assert {e["MASTER_ADDR"] for e in envs.values()} == {"10.0.0.1"}  # rank 0's registered address
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1
    assert sorted(e["NODE_RANK"] for e in envs.values()) == ["0", "1"]
    for e in envs.values():
        assert (e["NNODES"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"]) == ("2", "4", "2")
        assert e["SLURM_JOB_ID"] == str(job.pk) and e["SLURM_NNODES"] == "2"
        assert e["SLURM_JOB_NODELIST"] == "gpu01,gpu02"
        assert e["SLURM_NODEID"] == e["NODE_RANK"]
    assert all(start["script"].startswith("#!/bin/bash") and start["argv"] == [] for start in starts.values())
    # One output file per node (a shared filesystem would interleave them otherwise).
    assert sorted(start["stdout_path"] for start in starts.values()) == [
        f"attune-{job.pk}.0.out",
        f"attune-{job.pk}.1.out",
    ]


def test_two_running_jobs_never_share_a_rendezvous_port_on_one_server(two_servers):
    user = UserFactory(username="ivan")
    for name in ("a", "b"):
        assert post(user, name=name, num_gpus=2, nodes=2, command="true").status_code == 201
    scheduling_round_run()
    ports = {(a.job_id, a.rendezvous_port) for job in Job.objects.all() for a in active(job)}
    by_job = {}
    for job_id, port in ports:
        by_job.setdefault(job_id, set()).add(port)
    assert all(len(p) == 1 for p in by_job.values())  # every part of a job: the same port
    assert len({next(iter(p)) for p in by_job.values()}) == 2  # two jobs: two ports


def test_an_own_command_without_nodes_never_spreads(two_servers):
    user = UserFactory(username="judy")
    assert post(user, name="a", num_gpus=3, command="true").status_code == 201
    assert post(user, name="b", num_gpus=2, command="true").status_code == 201
    scheduling_round_run()
    a, b = Job.objects.order_by("id")
    assert len(active(a)) == 1
    # b fits on gpu02 whole (a takes 3 of gpu01's 4): one server, never a 1 + 1 split.
    assert {p.server.name for p in active(b)} != {"gpu01", "gpu02"} and len(active(b)) == 1


def _two_node_job(two_servers, command="torchrun train.py"):
    answer = post(UserFactory(username="kim"), name="ddp", num_gpus=4, nodes=2, command=command)
    assert answer.status_code == 201, answer.content
    job = Job.objects.get(pk=answer.json()["id"])
    scheduling_round_run()
    rank0, rank1 = sorted(active(job), key=lambda a: a.pk)
    return job, rank0, rank1


def _report(lease, seq, kind, **data):
    """`lease`'s agent sends one report in a sync."""
    body = {
        "lease_id": str(lease.lease_id),
        "seq": seq,
        "kind": kind,
        "at": timezone.now().isoformat(),
        "data": data,
    }
    answer = synced(agent_client(lease.server), reports=[body])
    assert answer["rejected"] == [] and answer["acked"] == [[str(lease.lease_id), seq]]


def test_a_multi_node_job_counts_progress_once_from_rank_0_and_ends_with_it(two_servers):
    job, rank0, rank1 = _two_node_job(two_servers)
    _report(rank1, 1, "progress", done_iters=900, iters_per_s=3.0)
    _report(rank0, 1, "progress", done_iters=40, iters_per_s=3.0)
    job.refresh_from_db()
    assert job.done_iters == 40  # rank 1's count is the same loop seen from another server
    _report(rank1, 2, "exited", exit_code=0, signal=None, oom=False)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and len(active(job)) == 2  # it keeps its resources
    _report(rank0, 2, "exited", exit_code=0, signal=None, oom=False)
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED and active(job) == []


def test_when_one_part_fails_every_part_is_stopped_and_the_job_fails_as_one(two_servers):
    job, rank0, rank1 = _two_node_job(two_servers)
    _report(rank1, 1, "exited", exit_code=3, signal=None, oom=False)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3
    assert active(job) == []
    # rank 0's agent is told to stop its part.
    commands = agent_commands(server=rank0.server, running=[rank0.lease_id])
    assert [c["kind"] for c in commands] == ["cancel"]


@pytest.mark.parametrize("silence", ["no heartbeat lately", "marked NOT_RESPONDING"])
def test_a_part_failing_while_another_parts_server_is_silent_requeues_the_job_as_a_node_failure(
    two_servers, silence
):
    """The lost server's fence stops its part and the survivor's collective errors out, often before
    the liveness sweep marks that server DOWN: the job is not FAILED but back in the queue, whole."""
    from datetime import timedelta

    from cluster_app.models import NodeState, ServerHeartbeat
    from scheduler_app.models import JobEvent

    job, rank0, rank1 = _two_node_job(two_servers)
    _report(rank0, 1, "progress", done_iters=40, iters_per_s=3.0)
    lost = rank1.server
    if silence == "marked NOT_RESPONDING":
        lost.state = NodeState.NOT_RESPONDING
        lost.save(update_fields=["state"])
    else:
        ServerHeartbeat.objects.update_or_create(
            server=lost, defaults={"at": timezone.now() - timedelta(hours=1)}
        )
    _report(rank0, 2, "exited", exit_code=1, signal=None, oom=False)
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.done_iters == 40 and job.exit_code is None
    assert active(job) == []
    assert JobEvent.objects.filter(job=job, to_state=JobState.NODE_FAIL, reason="node_down").exists()
    exited = JobEvent.objects.get(job=job, kind="lease_exited")
    assert exited.data["silent_servers"] == [lost.name]
    # The lost server's agent, back, is told to stop its orphaned part.
    assert [c["kind"] for c in agent_commands(server=lost, running=[rank1.lease_id])] == ["cancel"]


def test_a_script_named_by_nothing_is_named_after_its_file_and_a_relative_chdir_follows_submit_dir(
    two_servers,
):
    answer = post(
        UserFactory(username="lena"),
        script="#!/bin/bash\n#SBATCH --chdir=runs/a\nrun\n",
        script_name="train.sh",
        submit_dir="/home/lena/project",
    )
    assert answer.status_code == 201, answer.content
    job = Job.objects.get(pk=answer.json()["id"])
    assert job.name == "train.sh" and job.work_dir == "/home/lena/project/runs/a"


def test_a_requeued_job_rendezvouses_on_a_fresh_port(two_servers):
    """An orphaned part of the last incarnation may still knock on the old port: it must not join."""
    from django.db import transaction

    from scheduler_app.services.job_control import job_requeue

    job, rank0, _ = _two_node_job(two_servers)
    with transaction.atomic():
        job_requeue(job=Job.objects.select_for_update().get(pk=job.pk), reason="preempted")
    scheduling_round_run()
    again = sorted(active(job), key=lambda a: a.pk)
    assert len(again) == 2 and again[0].rendezvous_port != rank0.rendezvous_port


def test_a_script_with_windows_line_endings_is_stored_with_unix_ones(two_servers):
    """What a browser's textarea sends: bash would fail on every \\r."""
    answer = post(UserFactory(username="mona"), script="#!/bin/bash\r\n#SBATCH --job-name=w\r\nsleep 1\r\n")
    assert answer.status_code == 201, answer.content
    assert Job.objects.get(pk=answer.json()["id"]).script == "#!/bin/bash\n#SBATCH --job-name=w\nsleep 1\n"
