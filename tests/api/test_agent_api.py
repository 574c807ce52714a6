"""The agent HTTP contract (docs/agent-protocol.md): auth, register, and the one sync call (its usage
sample, its commands and its reports). The sync's own guarantees (reports before commands, constant cost,
a poisoned batch, waking) are tested in tests/api/test_agent_sync.py."""

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from cluster_app.models import AgentCredential, Gpu, GpuUsageSample, NodeState, Server, UsageSample
from scheduler_app.models import AgentReport, Allocation, Job, JobEvent, JobState
from scheduler_app.services.job_control import job_cancel
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.agent_native import agent_path  # noqa: F401  (the fixture)
from tests.api.helpers import SYNC, agent_client, lease_of, make_server, submit, sync, synced, usage_sample
from tests.factories import heartbeat_at

# Each test twice: through Django's handler and DRF's view, and through config/agent_calls.py first.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("agent_path")]

REGISTER = "/api/v1/agent/register"


@pytest.fixture(autouse=True)
def restarts_free(settings):
    """The protocol around a preemption is the subject: restart costs off, so that a round preempts a
    job that started an instant ago (the minimum run time would otherwise keep it)."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "restart_costs": False}


def inventory(n: int = 4, prefix: str = "GPU-real") -> dict:
    return {
        "agent_version": "1.0.0",
        "hostname": "gpu01.lab",
        "num_cpus": 12,
        "mem_gb": 250.0,
        "storage_mbps": 400.0,
        "cgroup_mode": "systemd-run",
        "gpus": [
            {"index": i, "uuid": f"{prefix}-{i}", "model": "Tesla V100", "memory_mb": 32768} for i in range(n)
        ],
    }


def report(lease, seq, kind, **data):
    return {
        "lease_id": str(lease),
        "seq": seq,
        "kind": kind,
        "at": (timezone.now()).isoformat(),
        "data": data,
    }


# --- authentication ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [REGISTER, SYNC])
def test_agent_endpoints_refuse_missing_and_wrong_tokens(path, server):
    assert APIClient().post(path, {}, format="json").status_code == 401
    wrong = APIClient()
    wrong.credentials(HTTP_AUTHORIZATION="Bearer not-a-real-token")
    response = wrong.post(path, {}, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_token_is_refused(server):
    client = agent_client(server)
    AgentCredential.objects.update(revoked_at=timezone.now())
    assert sync(client).status_code == 401


def test_a_user_token_does_not_open_agent_endpoints_and_an_agent_token_not_user_ones(user, server):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    assert sync(client).status_code == 401
    assert agent_client(server).get("/api/v1/jobs/").status_code in (401, 403)


def test_the_credential_records_its_last_use(agent):
    synced(agent)
    assert AgentCredential.objects.get().last_used_at is not None


# --- register -----------------------------------------------------------------------------------------


def test_register_replaces_the_inventory_and_answers_the_sync_interval(agent, server, settings):
    settings.ATTUNE_AGENT_SYNC_INTERVAL_S = 7.5
    server.state = NodeState.NOT_RESPONDING
    server.save()
    response = agent.post(REGISTER, inventory(n=2), format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "server": "gpu01",
        "sync_interval_s": 7.5,
        "fence": {"lease_fence_s": 60.0, "grace_s": 30.0},
    }
    server.refresh_from_db()
    assert (server.num_gpus, server.num_cpus, server.mem_gb) == (2, 12, 250.0)
    assert server.state == NodeState.IDLE and server.last_heartbeat_at is not None
    assert server.agent_version == "1.0.0" and server.gpu_model == "Tesla V100"
    assert list(server.gpus.order_by("index").values_list("index", "uuid")) == [
        (0, "GPU-real-0"),
        (1, "GPU-real-1"),
    ]
    # Registering the same inventory again changes nothing.
    assert agent.post(REGISTER, inventory(n=2), format="json").status_code == 200
    assert Gpu.objects.filter(server=server).count() == 2


def test_register_retires_a_gpu_that_history_points_at(agent, server, running):
    held = lease_of(running).gpu_holds.first().gpu
    Allocation.objects.filter(job=running).update(ended_at=timezone.now())
    from scheduler_app.models import AllocationGpu

    AllocationGpu.objects.update(released_at=timezone.now())
    keep = [i for i in range(4) if i != held.index]
    body = inventory(n=4)
    body["gpus"] = [g for g in body["gpus"] if g["index"] in keep]
    assert agent.post(REGISTER, body, format="json").status_code == 200
    held.refresh_from_db()
    assert held.retired_at is not None
    server.refresh_from_db()
    assert server.num_gpus == 3


def test_register_refuses_gpus_of_another_server(agent):
    other = make_server("gpu02", gpus=1)
    taken = other.gpus.get().uuid
    body = inventory(n=2)
    body["gpus"][1]["uuid"] = taken
    response = agent.post(REGISTER, body, format="json")
    assert response.status_code == 409
    assert response.json()["conflicting_uuids"] == [taken]


def test_register_validates_its_body(agent):
    body = inventory(n=2)
    body["gpus"][1]["index"] = 0
    assert agent.post(REGISTER, body, format="json").status_code == 400
    assert agent.post(REGISTER, {**inventory(), "gpus": []}, format="json").status_code == 400


# --- the sync's answer ---------------------------------------------------------------------------------


def test_a_sync_answers_state_commands_acks_and_interval_and_no_wait_without_waking(agent, settings):
    settings.ATTUNE_AGENT_WAKE = False
    settings.ATTUNE_AGENT_SYNC_INTERVAL_S = 4.0
    assert synced(agent) == {
        "state": "IDLE",
        "commands": [],
        "acked": [],
        "rejected": [],
        "sync_interval_s": 4.0,
        "wait": None,
        "fence": {"lease_fence_s": 60.0, "grace_s": 30.0},
    }


# --- the sample (usage; marks the server alive) ---------------------------------------------------------


def test_a_sample_is_stored_once_per_sampled_at(agent, server):
    gpu = server.gpus.get(index=0)
    beat = usage_sample(  # sampled_at: now (usage_sample's), sent twice
        cpu_util_pct=41.5,
        mem_used_gb=120.3,
        gpus=[
            {"uuid": gpu.uuid, "util_pct": 97.0, "mem_used_mb": 20480},
            {"uuid": "GPU-elsewhere", "util_pct": 1, "mem_used_mb": 1},
        ],
    )
    for _ in range(2):
        assert synced(agent, sample=beat)["state"] == "IDLE"
    assert UsageSample.objects.filter(server=server).count() == 1
    assert GpuUsageSample.objects.filter(gpu=gpu).count() == 1
    assert GpuUsageSample.objects.count() == 1


@pytest.mark.parametrize("state", [NodeState.NOT_RESPONDING, NodeState.DOWN])
def test_a_sync_brings_a_silent_server_back(agent, server, running, state):
    Server.objects.filter(pk=server.pk).update(state=state, state_reason="silent")
    beat = {"sampled_at": timezone.now().isoformat(), "cpu_util_pct": 1, "mem_used_gb": 1}  # no "gpus"
    assert synced(agent, sample=beat, running=[lease_of(running).lease_id])["state"] == "MIXED"
    server.refresh_from_db()
    assert server.state == NodeState.MIXED and server.state_reason == ""


@pytest.mark.parametrize(
    "sample",
    [
        None,
        {},
        {"cpu_util_pct": 1, "mem_used_gb": 1},  # no sampled_at
        {**usage_sample(), "cpu_util_pct": 101},
        {**usage_sample(), "mem_used_gb": -1},
        {**usage_sample(), "gpus": [{"uuid": "GPU-0", "util_pct": "busy", "mem_used_mb": 1}]},
        "now",
    ],
)
def test_a_malformed_sample_refuses_the_whole_sync(agent, running, sample):
    lease = lease_of(running).lease_id
    body = {"running": [str(lease)], "reports": [report(lease, 1, "progress", done_iters=10)]}
    if sample is not None:
        body["sample"] = sample
    response = agent.post(SYNC, body, format="json")
    assert response.status_code == 400
    assert "sample" in response.json()
    assert not AgentReport.objects.exists() and not UsageSample.objects.exists()
    running.refresh_from_db()
    assert running.done_iters == 0


# --- commands ---------------------------------------------------------------------------------------


def test_a_sync_starts_the_leases_the_agent_does_not_run(agent, running):
    Job.objects.filter(pk=running.pk).update(done_iters=120)
    lease = lease_of(running)
    (command,) = synced(agent, running=[])["commands"]
    assert command["kind"] == "start"
    assert command["lease_id"] == str(lease.lease_id)
    assert command["job_id"] == running.pk and command["job_name"] == "res18-a"
    assert command["argv"] == ["python", "-m", "agent.workload", "--model", "res18", "--iters", "1000"]
    assert command["gpu_uuids"] == [h.gpu.uuid for h in lease.gpu_holds.order_by("gpu__index")]
    assert command["num_cpus"] == lease.num_cpus and command["mem_gb"] == lease.mem_gb
    assert command["resume_iters"] == 120
    env = command["env"]
    assert env["ATTUNE_JOB_ID"] == str(running.pk) and float(env["ATTUNE_MEM_GB"]) == lease.mem_gb
    profile = json.loads(env["ATTUNE_PROFILE_JSON"])
    assert set(profile) == {"iter_time_s", "cpu_per_gpu_grid", "mem_gb_per_gpu_grid", "tput"}
    # Once the agent runs it, nothing more to do.
    assert synced(agent, running=[lease.lease_id])["commands"] == []


def test_a_sync_starts_an_own_command(agent, user, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False}
    job = submit(user, gpus=1, command="python train.py --epochs 3")
    scheduling_round_run()
    # `running` and `reports` may be left out: a sync of a node that runs nothing and has nothing to say.
    response = agent.post(SYNC, {"sample": usage_sample()}, format="json")
    assert response.status_code == 200, response.json()
    (command,) = response.json()["commands"]
    assert command["argv"] == ["sh", "-c", "python train.py --epochs 3"]
    assert "ATTUNE_PROFILE_JSON" not in command["env"] and command["job_id"] == job.pk


def test_a_sync_preempts_a_lease_the_scheduler_ended(agent, running, staff_user):
    lease = lease_of(running)
    submit(staff_user, gpus=4, priority=10, name="urgent")
    scheduling_round_run()
    commands = synced(agent, running=[lease.lease_id])["commands"]
    assert {"kind": "preempt", "lease_id": str(lease.lease_id), "grace_s": 30} in commands
    assert [c["kind"] for c in commands].count("start") == 1  # the urgent job


def _moved_while_stopping(agent, running, staff_user):
    """`running`'s lease A started (reported), then preempted by an urgent job; the urgent job is
    cancelled and the next round places `running` again: lease B. Returns (A, B)."""
    old = lease_of(running)
    synced(agent, running=[old.lease_id], reports=[report(old.lease_id, 1, "started", pid=42)])
    urgent = submit(staff_user, gpus=4, priority=10, name="urgent")
    scheduling_round_run()
    job_cancel(job=urgent, by=staff_user)
    scheduling_round_run()
    new = lease_of(running)
    assert new.pk != old.pk and running.allocations.get(pk=old.pk).end_reason == "preempted"
    return old, new


def starts(answer) -> list[str]:
    return [c["lease_id"] for c in answer["commands"] if c["kind"] == "start"]


def test_a_job_placed_again_starts_only_once_its_preempted_process_exited(agent, running, staff_user):
    old, new = _moved_while_stopping(agent, running, staff_user)
    # A still writes its checkpoint (the agent lists it as running): B would resume from a stale one.
    answer = synced(agent, running=[old.lease_id])
    assert starts(answer) == [] and answer["commands"][0]["kind"] == "preempt"
    # The agent has not said A is gone, even though it no longer lists it: still held.
    assert starts(synced(agent)) == []
    exited = report(old.lease_id, 2, "exited", exit_code=None, signal=15, done_iters=0)
    assert starts(synced(agent, reports=[exited])) == [str(new.lease_id)]
    assert Allocation.objects.get(pk=old.pk).exited_at is not None


FENCE_EXPIRY_S = 60 + 30 + 10  # ATTUNE_LEASE_FENCE_S + _GRACE_S + _MARGIN_S, their defaults


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            {
                "started_at": timezone.now() - timedelta(seconds=FENCE_EXPIRY_S + 60),
                "ended_at": timezone.now() - timedelta(seconds=FENCE_EXPIRY_S + 1),
            },
            id="fence_expired_since_its_end",
        ),
        pytest.param({"agent_started_at": None, "start_sent_at": None}, id="never_sent_nor_started"),
    ],
)
def test_a_stopping_lease_holds_the_next_one_back_only_while_it_may_still_run(
    agent, running, staff_user, change
):
    old, new = _moved_while_stopping(agent, running, staff_user)
    Allocation.objects.filter(pk=old.pk).update(**change)
    assert starts(synced(agent)) == [str(new.lease_id)]


def test_a_lease_whose_end_reason_is_node_fail_still_holds_the_next_one_back_on_a_live_server(
    agent, running, staff_user
):
    # Its server syncs (this very agent): whatever the end reason, its process may still run there.
    old, _new = _moved_while_stopping(agent, running, staff_user)
    Allocation.objects.filter(pk=old.pk).update(end_reason="node_fail")
    assert starts(synced(agent)) == []


@pytest.mark.parametrize(("silent_s", "held"), [(FENCE_EXPIRY_S + 1, False), (FENCE_EXPIRY_S - 20, True)])
def test_a_lease_on_a_silent_server_holds_the_next_one_back_until_its_fence_expired(
    agent, running, staff_user, silent_s, held
):
    """The old lease ran on a server that stopped syncing: it is stopped there by its fence once its
    agent's last sync is the fence's expiry old, and only then may the job start elsewhere."""
    old, new = _moved_while_stopping(agent, running, staff_user)
    silent = make_server("silent01", gpus=4)
    heartbeat_at(silent, timezone.now() - timedelta(seconds=silent_s))
    Allocation.objects.filter(pk=old.pk).update(server=silent, end_reason="node_fail")
    assert starts(synced(agent)) == ([] if held else [str(new.lease_id)])


def test_a_start_sent_in_an_answer_is_recorded_once(agent, server, user, settings):
    job = submit(user, gpus=1)
    scheduling_round_run()
    lease = lease_of(job)
    assert lease.start_sent_at is None
    assert starts(synced(agent)) == [str(lease.lease_id)]
    first = Allocation.objects.get(pk=lease.pk).start_sent_at
    assert first is not None
    assert starts(synced(agent)) == [str(lease.lease_id)]  # not yet acknowledged: sent again
    assert Allocation.objects.get(pk=lease.pk).start_sent_at == first


def test_a_sync_cancels_a_cancelled_job_and_unknown_leases(agent, running, user):
    lease = lease_of(running)
    job_cancel(job=running, by=user)
    stranger = uuid.uuid4()
    commands = synced(agent, running=[lease.lease_id, stranger])["commands"]
    assert {"kind": "cancel", "lease_id": str(lease.lease_id), "grace_s": 10} in commands
    assert {"kind": "cancel", "lease_id": str(stranger), "grace_s": 10} in commands


def test_a_sync_tells_a_draining_server_to_drain(agent, server):
    Server.objects.filter(pk=server.pk).update(state=NodeState.DRAINING)
    answer = synced(agent)
    assert answer["commands"] == [{"kind": "drain"}] and answer["state"] == "DRAINING"


@pytest.mark.parametrize("bad", [["nope"], "nope", [1], [None], {"lease": "x"}])
def test_a_malformed_running_list_refuses_the_whole_sync(agent, running, bad):
    lease = lease_of(running).lease_id
    body = {"sample": usage_sample(), "running": bad, "reports": [report(lease, 1, "progress", done_iters=5)]}
    response = agent.post(SYNC, body, format="json")
    assert response.status_code == 400 and "running" in response.json()
    assert not AgentReport.objects.exists()


# --- reports ----------------------------------------------------------------------------------------


def test_reports_apply_started_progress_and_log(agent, running):
    lease = lease_of(running).lease_id
    t0 = timezone.now()
    batch = [
        {
            **report(lease, 1, "started", pid=4242, isolation="affinity+rlimit", cpus=[0, 1]),
            "at": t0.isoformat(),
        },
        {
            **report(lease, 2, "progress", done_iters=500, iters_per_s=3.1),
            "at": (t0 + timedelta(seconds=10)).isoformat(),
        },
        report(lease, 3, "log", lines=["epoch 1", "epoch 2"]),
    ]
    answer = synced(agent, running=[lease], reports=batch)
    assert answer["acked"] == [[str(lease), 1], [str(lease), 2], [str(lease), 3]]
    assert answer["rejected"] == [] and answer["commands"] == []
    running.refresh_from_db()
    assert running.done_iters == 500
    assert running.attained_service_gpu_s == pytest.approx(2 * 10.0)
    allocation = lease_of(running)
    assert allocation.iters_per_s == 3.1 and allocation.log_tail == "epoch 1\nepoch 2"
    event = JobEvent.objects.get(job=running, kind="lease_started")
    assert event.data["pid"] == 4242 and event.reason == "affinity+rlimit"
    # Progress never goes backwards.
    synced(agent, running=[lease], reports=[report(lease, 4, "progress", done_iters=100)])
    running.refresh_from_db()
    assert running.done_iters == 500


def test_the_same_batch_twice_is_applied_once(agent, running):
    lease = lease_of(running).lease_id
    t0 = timezone.now()
    batch = [
        {**report(lease, 1, "started", pid=1), "at": t0.isoformat()},
        {**report(lease, 2, "progress", done_iters=200), "at": (t0 + timedelta(seconds=5)).isoformat()},
        report(lease, 3, "log", lines=["hello"]),
    ]
    first = synced(agent, running=[lease], reports=batch)
    second = synced(agent, running=[lease], reports=batch)
    assert (first["acked"], first["rejected"]) == (second["acked"], second["rejected"])
    assert len(second["acked"]) == 3 and second["rejected"] == []
    running.refresh_from_db()
    assert running.attained_service_gpu_s == pytest.approx(2 * 5.0)
    assert JobEvent.objects.filter(job=running, kind="lease_started").count() == 1
    assert lease_of(running).log_tail == "hello"
    assert AgentReport.objects.count() == 3


def test_a_report_for_another_servers_lease_is_rejected_as_not_found(running):
    other = agent_client(make_server("gpu02", gpus=1))
    lease = lease_of(running).lease_id
    answer = synced(other, running=[lease], reports=[report(lease, 1, "progress", done_iters=999)])
    assert answer["acked"] == []
    assert answer["rejected"] == [
        {"lease_id": str(lease), "seq": 1, "error": "lease not found on this server", "code": 404}
    ]
    # Nor is the lease its own to run: gpu02's agent is told to stop it.
    assert answer["commands"] == [{"kind": "cancel", "lease_id": str(lease), "grace_s": 10}]
    running.refresh_from_db()
    assert running.done_iters == 0


def test_a_malformed_report_is_rejected_and_the_rest_applied(agent, running):
    lease = lease_of(running).lease_id
    bad = report(lease, 1, "progress")  # no done_iters
    good = report(lease, 2, "progress", done_iters=10)
    body = synced(agent, running=[lease], reports=[bad, good, {"seq": "x"}])
    assert body["acked"] == [[str(lease), 2]]
    assert [(r["seq"], r["code"]) for r in body["rejected"]] == [(1, 400), (None, 400)]
    running.refresh_from_db()
    assert running.done_iters == 10
    # A `reports` that is not a list is the whole call's fault; an item that is not an object, its own.
    response = agent.post(SYNC, {"sample": usage_sample(), "reports": "nope"}, format="json")
    assert response.status_code == 400 and "reports" in response.json()
    for reports in (["nope"], [1]):
        response = agent.post(SYNC, {"sample": usage_sample(), "reports": reports}, format="json")
        assert response.status_code == 200 and response.json()["rejected"][0]["code"] == 400


def test_exit_zero_with_all_work_done_completes_the_job(
    agent, running, django_capture_on_commit_callbacks, monkeypatch
):
    requested = []
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request",
        lambda *, trigger: requested.append(trigger),
    )
    lease = lease_of(running)
    exited = report(lease.lease_id, 1, "exited", exit_code=0, signal=None, oom=False, done_iters=1000)
    with django_capture_on_commit_callbacks(execute=True):
        synced(agent, reports=[exited])  # the process is gone: not in `running`
    running.refresh_from_db()
    assert running.state == JobState.COMPLETED and running.exit_code == 0 and running.finished_at
    assert running.done_iters == 1000
    lease.refresh_from_db()
    assert lease.ended_at is not None and lease.end_reason == "completed" and lease.exit_code == 0
    assert not lease.gpu_holds.filter(released_at__isnull=True).exists()
    assert requested == ["job_end"]  # the job's end asks for an early round


@pytest.mark.parametrize(
    ("data", "state", "exit_code"),
    [
        ({"exit_code": 0, "done_iters": 10}, JobState.FAILED, 0),
        ({"exit_code": 3, "done_iters": 10}, JobState.FAILED, 3),
        ({"exit_code": None, "signal": 9}, JobState.FAILED, 137),
        ({"exit_code": 137, "oom": True}, JobState.OUT_OF_MEMORY, 137),
    ],
)
def test_other_exits_fail_the_job(agent, running, data, state, exit_code):
    lease = lease_of(running)
    synced(agent, reports=[report(lease.lease_id, 1, "exited", **data)])
    running.refresh_from_db()
    assert (running.state, running.exit_code) == (state, exit_code)


def test_a_start_and_an_exit_in_one_sync_read_in_that_order_on_the_timeline(agent, running):
    lease = lease_of(running).lease_id
    started = report(lease, 1, "started", isolation="affinity+rlimit")
    failed = "start failed: cannot open the stdout file '/home/alice/attune-7.out': Permission denied"
    exited = report(lease, 2, "exited", exit_code=None, error=failed)
    synced(agent, reports=[started, exited])  # the agent saw both before its next sync
    running.refresh_from_db()
    assert (running.state, running.exit_code) == (JobState.FAILED, None)
    kinds = [e.kind for e in running.events.all()]  # the timeline's order: (at, id)
    assert kinds[-2:] == ["lease_started", "failed"], kinds
    assert running.events.get(kind="failed").message == failed


def test_a_preempted_lease_exiting_leaves_the_job_queued_with_its_progress(agent, running, staff_user):
    lease = lease_of(running)
    submit(staff_user, gpus=4, priority=10, name="urgent")
    scheduling_round_run()
    running.refresh_from_db()
    assert running.state == JobState.PENDING
    synced(
        agent,
        reports=[
            report(lease.lease_id, 1, "progress", done_iters=400),
            report(lease.lease_id, 2, "exited", exit_code=None, signal=15, done_iters=420),
        ],
    )
    running.refresh_from_db()
    assert running.state == JobState.PENDING and running.done_iters == 420
    assert JobEvent.objects.filter(job=running, kind="lease_exited", reason="preempted").exists()


def test_a_cancelled_lease_exiting_keeps_the_job_cancelled(agent, running, user):
    lease = lease_of(running)
    job_cancel(job=running, by=user)
    synced(agent, reports=[report(lease.lease_id, 1, "exited", exit_code=None, signal=15)])
    running.refresh_from_db()
    assert running.state == JobState.CANCELLED


def test_registration_and_a_returning_server_ask_for_an_early_round(
    agent, server, django_capture_on_commit_callbacks, monkeypatch
):
    requested = []
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request",
        lambda *, trigger: requested.append(trigger),
    )
    Server.objects.filter(pk=server.pk).update(state=NodeState.DOWN)
    with django_capture_on_commit_callbacks(execute=True):
        synced(agent)  # back: asks for a round
        synced(agent)  # alive already: asks for nothing
        agent.post(REGISTER, inventory(), format="json")
    assert requested == ["node_back", "register"]


def test_a_lease_that_could_not_start_fails_the_job_with_the_agents_error(agent, running):
    lease = lease_of(running)
    data = {
        "exit_code": None,
        "signal": None,
        "oom": False,
        "done_iters": None,
        "stop": None,
        "error": "start failed: this node has no GPU GPU-x",
    }
    body = synced(agent, reports=[report(lease.lease_id, 1, "exited", **data)])
    assert body["rejected"] == [] and body["acked"] == [[str(lease.lease_id), 1]]
    running.refresh_from_db()
    assert running.state == JobState.FAILED and running.exit_code is None
    event = JobEvent.objects.get(job=running, kind="failed")
    assert event.reason == "start_failed" and "no GPU" in event.message


def test_a_lease_stopped_by_the_agents_own_shutdown_requeues_the_job(agent, running):
    lease = lease_of(running)
    data = {"exit_code": None, "signal": 15, "oom": False, "done_iters": 250, "stop": "agent_exit"}
    synced(agent, reports=[report(lease.lease_id, 1, "exited", **data)])
    running.refresh_from_db()
    lease.refresh_from_db()
    assert running.state == JobState.PENDING and running.done_iters == 250
    assert lease.end_reason == "agent_exit" and lease.ended_at is not None
    assert JobEvent.objects.filter(
        job=running, kind="requeued", from_state="RUNNING", to_state="PENDING"
    ).exists()
