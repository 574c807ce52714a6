"""GENIE's lightweight profiling run in the service: dispatch, the agents' commands and reports through the
sync endpoint, the stored fit with its residuals, the platform-model fill-in, and the selector."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from cluster_app.models import NodeState
from profiles_app.genie_profiling import genie_fit_store, genie_profiling_run_queue, platform_comm_s
from profiles_app.models import GenieFit, ProfilingKind, ProfilingRun, ProfilingRunStatus, Workload
from profiles_app.selectors import profiling_holds, workload_predictor
from profiles_app.services.workloads import workload_register
from scheduler_app.core.predictor import Predictor
from scheduler_app.services.profiling import profiling_jobs_hold, profiling_run_dispatch
from tests.api.helpers import agent_client, make_server, synced
from tests.factories import JobFactory, UserFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

TRUTH = Predictor(alpha=0.002, beta=0.05, t_intra=0.06, t_cross=0.12)


def genie_workload(name: str = "genie-cnn", *, batch_size: int = 32) -> Workload:
    return WorkloadFactory(name=name, batch_size=batch_size)


def queue_and_dispatch(workload: Workload, **kwargs: Any) -> ProfilingRun:
    run = genie_profiling_run_queue(workload=workload, **kwargs)
    assert profiling_run_dispatch(run_id=run.pk) == ProfilingRunStatus.RUNNING
    run.refresh_from_db()
    return run


def genie_commands(server) -> list[dict]:
    return [c for c in synced(agent_client(server))["commands"] if c.get("method") == "genie"]


def point(run: ProfilingRun, seq: int, config: dict, *, lease_id: str | None = None, **data: Any) -> dict:
    seconds = TRUTH.iter_time_s(config["num_servers"], config["gpus"], config["batch"])
    return {
        "lease_id": lease_id or str(run.lease_id),
        "seq": seq,
        "kind": "profile_point",
        "at": timezone.now().isoformat(),
        "data": {"config": config["key"], "sec_per_iter": seconds, "node_rank": 7, "iters": 35, **data},
    }


def measure_all(run: ProfilingRun, server, *, first_seq: int = 1, **data: Any) -> dict:
    """One agent's sync reporting every configuration its command names; the sync's answer."""
    (command,) = genie_commands(server)
    lease_id = command["lease_id"]  # a peer reports under a lease id of its own
    reports = [
        point(run, first_seq + i, c, lease_id=lease_id, **data) for i, c in enumerate(command["configs"])
    ]
    answer = synced(agent_client(server), running=[lease_id], reports=reports)
    assert len(answer["acked"]) == len(reports) and not answer["rejected"]
    return answer


def test_a_run_on_two_servers_measures_every_configuration_and_stores_the_fit():
    a = make_server("gpu01", gpus=4, cpus=24, mem_gb=500)
    b = make_server("gpu02", gpus=4, cpus=24, mem_gb=500)
    workload = genie_workload()
    run = queue_and_dispatch(workload, max_s_per_config=45)
    assert run.kind == ProfilingKind.GENIE_PREDICTOR
    assert (run.server, run.num_gpus, run.peer_server, len(run.peer_gpu_indices)) == (a, 2, b, 1)
    assert [c["key"] for c in run.configs] == ["n2k1b32", "n1k1b16", "n1k1b32", "n1k1b64", "n1k2b32"]
    # Rounds leave what it holds alone, on both servers: 2 GPUs and 6 cores, 1 GPU and 3 cores.
    holds = {(h.server_id, len(h.gpu_indices), h.num_cpus) for h in profiling_holds()}
    assert holds == {(a.pk, 2, 6), (b.pk, 1, 3)}

    (on_a,) = genie_commands(a)
    assert on_a["max_s_per_config"] == 45 and len(on_a["gpu_uuids"]) == 2
    assert [(c["key"], c["gpus"], c["num_cpus"], c["node_rank"]) for c in on_a["configs"]] == [
        ("n2k1b32", 1, 3, 0),
        ("n1k1b16", 1, 3, 0),
        ("n1k1b32", 1, 3, 0),
        ("n1k1b64", 1, 3, 0),
        ("n1k2b32", 2, 6, 0),
    ]
    assert on_a["configs"][0]["env"]["NNODES"] == "2" and on_a["configs"][0]["argv"][-2:] == ["--batch", "32"]
    (on_b,) = genie_commands(b)
    assert [(c["key"], c["node_rank"]) for c in on_b["configs"]] == [("n2k1b32", 1)]
    assert on_b["configs"][0]["env"]["NODE_RANK"] == "1" and len(on_b["gpu_uuids"]) == 1
    assert on_b["lease_id"] == str(run.peer_lease_id) != on_a["lease_id"]

    # The peer's part first: once both ranks of the cross-server configuration are in, the peer is free.
    cross = on_a["configs"][0]
    synced(agent_client(a), running=[run.lease_id], reports=[point(run, 1, cross)])
    run.refresh_from_db()
    assert run.peer_released_at is None
    measure_all(run, b)
    run.refresh_from_db()
    assert run.peer_released_at is not None and run.status == ProfilingRunStatus.RUNNING, run.measured_points
    assert {h.server_id for h in profiling_holds()} == {a.pk}
    answer = synced(agent_client(b), running=[run.peer_lease_id])
    assert {"kind": "cancel", "lease_id": str(run.peer_lease_id), "grace_s": 10} in answer["commands"]

    (on_a,) = genie_commands(a)
    assert [c["key"] for c in on_a["configs"]] == ["n1k1b16", "n1k1b32", "n1k1b64", "n1k2b32"]
    measure_all(run, a, first_seq=2, param_bytes=44_700_000, startup_s=3.5)
    run.refresh_from_db()
    assert run.status == ProfilingRunStatus.SUCCEEDED, run.error
    assert run.cost_gpu_s > 0 and not profiling_holds()
    assert not genie_commands(a)

    fit = GenieFit.objects.get(workload=workload)
    assert fit.run == run
    for got, true in (
        (fit.alpha_s, TRUTH.alpha),
        (fit.beta_s, TRUTH.beta),
        (fit.t_intra_s, TRUTH.t_intra),
        (fit.t_cross_s, TRUTH.t_cross),
    ):
        assert got == pytest.approx(true, rel=1e-9)
    assert fit.startup_s == 3.5 and fit.r2 == pytest.approx(1.0)
    assert fit.measured == ["alpha", "beta", "t_intra", "t_cross"] and fit.filled == {}
    assert [s["config"] for s in fit.samples] == [c["key"] for c in run.configs]
    assert len(fit.samples[0]["ranks"]) == 2  # both servers' parts; the node rank is the server's
    assert {r["config"] for r in fit.residuals} == {c["key"] for c in run.configs}
    assert all(abs(r["error_pct"]) < 1e-6 for r in fit.residuals)

    predictor = workload_predictor(Workload.objects.get(pk=workload.pk))
    assert predictor is not None
    assert predictor.iter_time_s(4, 2, 64) == pytest.approx(TRUTH.iter_time_s(4, 2, 64), rel=1e-9)
    assert predictor.startup_s == 3.5


def test_one_server_with_one_gpu_fills_both_terms_from_the_platform_model():
    server = make_server("solo", gpus=1, cpus=8, mem_gb=100)
    server.nic_gbps = 25.0
    server.save()
    workload = genie_workload(batch_size=0)  # no batch size: the configured default (32)
    run = queue_and_dispatch(workload)
    assert run.peer_server is None and run.num_gpus == 1
    assert [c["key"] for c in run.configs] == ["n1k1b16", "n1k1b32", "n1k1b64"]
    measure_all(run, server, param_bytes=50_000_000)
    run.refresh_from_db()
    assert run.status == ProfilingRunStatus.SUCCEEDED, run.error
    fit = GenieFit.objects.get(run=run)
    assert fit.measured == ["alpha", "beta"]
    # 2 P / B: 50 MB over 25 Gb/s across servers, over the configured 100 Gb/s inside one.
    assert fit.t_cross_s == pytest.approx(2 * 50e6 * 8 / 25e9)
    assert fit.t_intra_s == pytest.approx(2 * 50e6 * 8 / 100e9)
    assert fit.filled["t_cross"].startswith("t_o from the platform model: the cluster has one server")
    assert fit.filled["t_intra"].startswith("t_intra from the platform model: no server has 2 GPUs")
    assert "reported by the workload" in fit.filled["t_cross"]
    assert "startup_s" in fit.filled  # the workload did not report it
    assert fit.alpha_s == pytest.approx(TRUTH.alpha) and fit.beta_s == pytest.approx(TRUTH.beta)


def test_no_second_server_free_is_said_and_the_default_model_size_used():
    make_server("gpu01", gpus=2, cpus=12, mem_gb=250)
    make_server("gpu02", gpus=2, cpus=12, mem_gb=250, state=NodeState.DRAINING)
    workload = genie_workload()
    run = queue_and_dispatch(workload)
    assert run.peer_server is None and run.num_gpus == 2
    assert run.result["unmeasured"] == {"t_cross": "no second server was free"}
    measure_all(run, run.server)
    fit = GenieFit.objects.get(run=run)
    assert set(fit.filled) == {"t_cross", "startup_s"}
    assert fit.filled["t_cross"].startswith("t_o from the platform model: no second server was free")
    assert fit.t_cross_s == pytest.approx(platform_comm_s(param_bytes=100e6, gbps=10.0))  # the defaults
    assert fit.t_intra_s == pytest.approx(TRUTH.t_intra)


def test_the_stored_fit_records_noisy_residuals_and_r2():
    workload = genie_workload()
    samples = [
        {"config": "n1k1b16", "num_servers": 1, "gpus_per_server": 1, "batch": 16, "iter_time_s": 0.0830},
        {"config": "n1k1b32", "num_servers": 1, "gpus_per_server": 1, "batch": 32, "iter_time_s": 0.1130},
        {"config": "n1k1b64", "num_servers": 1, "gpus_per_server": 1, "batch": 64, "iter_time_s": 0.1790},
        {"config": "n1k2b32", "num_servers": 1, "gpus_per_server": 2, "batch": 32, "iter_time_s": 0.1750},
    ]
    fit = genie_fit_store(
        workload=workload,
        samples=samples,
        unmeasured={"t_cross": "no second server was free"},
        startup_s=2.0,
        param_bytes=None,
        nic_gbps=40.0,
    )
    assert fit.run is None and 0.99 < fit.r2 < 1.0 and fit.r2_compute < 1.0
    by_config = {r["config"]: r for r in fit.residuals}
    assert by_config["n1k1b32"]["measured_s"] == 0.1130
    assert by_config["n1k1b32"]["error_pct"] != 0  # three points off a line: residuals are not zero
    assert by_config["n1k2b32"]["predicted_s"] == pytest.approx(0.1750)  # t_intra fits its one sample
    assert fit.t_cross_s == pytest.approx(2 * 100e6 * 8 / 40e9)
    workload.refresh_from_db()
    assert (workload.genie_alpha_s, workload.genie_t_cross_s, workload.genie_fit_r2) == (
        fit.alpha_s,
        fit.t_cross_s,
        fit.r2,
    )
    with pytest.raises(ValueError, match="two or more distinct batch sizes"):
        genie_fit_store(
            workload=workload,
            samples=samples[:1],
            unmeasured={},
            startup_s=None,
            param_bytes=None,
            nic_gbps=10,
        )


def test_the_selector_is_none_until_a_fit_is_stored():
    workload = genie_workload()
    assert workload_predictor(workload) is None
    workload.genie_alpha_s, workload.genie_beta_s = 0.001, 0.02
    workload.genie_t_intra_s, workload.genie_t_cross_s, workload.genie_startup_s = 0.01, 0.05, 4.0
    assert workload_predictor(workload) == Predictor(0.001, 0.02, 0.01, 0.05, 4.0)


def test_a_failed_configuration_fails_the_run_and_does_not_block_synergy_profiling():
    server = make_server("gpu01", gpus=2, cpus=12, mem_gb=250)
    workload = workload_register(name="fresh", batch_size=32)  # no sensitivity matrix either
    run = queue_and_dispatch(workload)
    error = {
        "lease_id": str(run.lease_id),
        "seq": 1,
        "kind": "profile_error",
        "at": timezone.now().isoformat(),
        "data": {"config": "n1k1b16", "error": "the workload exited with 2", "exit_code": 2},
    }
    synced(agent_client(server), running=[run.lease_id], reports=[error])
    run.refresh_from_db()
    assert run.status == ProfilingRunStatus.FAILED and "n1k1b16" in run.error
    assert workload_predictor(Workload.objects.get(pk=workload.pk)) is None
    # Its jobs still get the Synergy profile they wait for.
    job = JobFactory(workload=workload, owner=UserFactory())
    held = profiling_jobs_hold(jobs=[job], servers=[server], now=timezone.now())
    assert held == {job.pk}
    assert ProfilingRun.objects.filter(
        workload=workload, kind=ProfilingKind.SYNERGY_CPU_SWEEP, status=ProfilingRunStatus.QUEUED
    ).exists()


def test_a_point_of_an_unknown_configuration_fails_the_run():
    server = make_server("gpu01", gpus=2, cpus=12, mem_gb=250)
    run = queue_and_dispatch(genie_workload())
    bogus = point(run, 1, {"key": "n9k9b9", "num_servers": 1, "gpus": 1, "batch": 9})
    synced(agent_client(server), running=[run.lease_id], reports=[bogus])
    run.refresh_from_db()
    assert run.status == ProfilingRunStatus.FAILED and "n9k9b9" in run.error


def test_the_api_shows_the_fit_with_the_workload(client):
    workload = genie_workload()
    samples = [
        {
            "config": f"n1k1b{b}",
            "num_servers": 1,
            "gpus_per_server": 1,
            "batch": b,
            "iter_time_s": 0.05 + 0.002 * b,
        }
        for b in (16, 64)
    ]
    genie_fit_store(
        workload=workload, samples=samples, unmeasured={}, startup_s=1.0, param_bytes=None, nic_gbps=10
    )
    user = UserFactory()
    client.force_login(user)
    body = client.get("/api/v1/workloads/").json()
    rows = body["results"] if isinstance(body, dict) else body
    (row,) = [w for w in rows if w["name"] == workload.name]
    genie = row["genie"]
    assert genie["alpha_s"] == pytest.approx(0.002) and genie["beta_s"] == pytest.approx(0.05)
    assert genie["measured"] == ["alpha", "beta"] and set(genie["filled"]) == {"t_intra", "t_cross"}
    assert len(genie["residuals"]) == 2 and genie["profiling_run"] is None
