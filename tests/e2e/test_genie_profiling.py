"""End to end: GENIE's lightweight profiling run of a workload on two real agent processes, and its fit.

PostgreSQL, Redis, a real Celery worker (dispatch and rounds), two real agents, and the synthetic workload
following GENIE's timing model with coefficients only its process knows (its ground truth, ±1 % noise per
launch). The run measures 3 batch sizes on 1 GPU, 2 GPUs of one server and 1 GPU on each of the two
servers; the stored fit recovers every coefficient within 10 %.
"""

from __future__ import annotations

import httpx
import pytest
from django.core.management import call_command
from rest_framework.authtoken.models import Token

from cluster_app.models import Server
from cluster_app.selectors import SCHEDULABLE_STATES
from profiles_app.models import GenieFit, ProfilingReport, ProfilingRun, ProfilingRunStatus, Workload
from profiles_app.selectors import workload_predictor
from profiles_app.services.workloads import workload_register
from tests.e2e.conftest import WORKER_ENV
from tests.e2e.processes import CeleryWorker, wait_until
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TIME_SCALE = 0.02
GENIE_TRUTH = {
    "alpha_s": 0.002,
    "beta_s": 0.05,
    "t_intra_s": 0.06,
    "t_cross_s": 0.12,
    "batch": 32,
    "noise": 0.01,
    "startup_s": 2.0,
    "param_bytes": 44_700_000,
}


# Liveness as a lab runs it, not the seconds of tests/e2e/conftest.py (made for the failure tests): on a
# loaded machine an agent's sync may come 8 s late, its server goes DOWN for a moment, and the run, which
# needs both servers free, measures t_cross on one and fills it from the platform model instead.
LAX_LIVENESS = {
    "ATTUNE_NODE_NOT_RESPONDING_AFTER_S": "30",
    "ATTUNE_NODE_DOWN_AFTER_S": "60",
    "ATTUNE_LEASE_FENCE_S": "35",
}


@pytest.fixture
def worker(e2e_ready, live_settings, tmp_path):
    """The e2e worker with LAX_LIVENESS; the web tier (this process) tells the agents the same fence."""
    live_settings.ATTUNE_LEASE_FENCE_S = float(LAX_LIVENESS["ATTUNE_LEASE_FENCE_S"])
    w = CeleryWorker(tmp_path, **{**WORKER_ENV, **LAX_LIVENESS})
    yield w
    w.stop()


def truth() -> dict:
    """Flat in CPU and memory (the run measures at the proportional share anyway), GENIE's timing model."""
    return {
        "iter_time_s": 1.0,
        "cpu_per_gpu_grid": [1, 3, 12],
        "mem_gb_per_gpu_grid": [62.5],
        "tput": [[1.0], [1.0], [1.0]],
        "genie": GENIE_TRUTH,
    }


def test_a_genie_profiling_run_on_two_agents_recovers_the_true_coefficients(start_agents, live_server):
    agents = start_agents(2, gpus=2, cpus=12, mem_gb=250.0, time_scale=TIME_SCALE)
    # Both registered and schedulable: a server not yet schedulable is not free, and the run would fill
    # t_o in from the platform model instead of measuring it.
    wait_until(
        lambda: (
            Server.objects.filter(state__in=SCHEDULABLE_STATES, gpus__isnull=False).distinct().count() == 2
        ),
        timeout_s=60,
        what="both agents",
    )
    workload = workload_register(
        name="genie-cnn", workload_class="image", batch_size=32, ground_truth=truth()
    )
    call_command("profile_workload", "genie-cnn", "--genie", "--max-s-per-config", "30")

    def run() -> ProfilingRun:
        return ProfilingRun.objects.get(workload=workload)

    wait_until(
        lambda: run().status in (ProfilingRunStatus.SUCCEEDED, ProfilingRunStatus.FAILED),
        timeout_s=120,
        what="the GENIE profiling run to end",
        interval_s=0.5,
    )
    done = run()
    logs = "\n".join(a.log_text()[-2000:] for a in agents)
    assert done.status == ProfilingRunStatus.SUCCEEDED, (done.error, logs)
    assert {done.server.name, done.peer_server.name} == {"node1", "node2"}
    assert done.num_gpus == 2 and done.max_s_per_config == 30 and done.cost_gpu_s > 0
    assert done.peer_released_at is not None and done.peer_released_at <= done.finished_at
    # Each server's agent reported under its own lease id: 5 configurations on one, the shared one on both.
    assert ProfilingReport.objects.filter(lease_id=done.lease_id, kind="profile_point").count() == 5
    assert ProfilingReport.objects.filter(lease_id=done.peer_lease_id, kind="profile_point").count() == 1

    fit = GenieFit.objects.get(run=done)
    fitted = {
        "alpha_s": fit.alpha_s,
        "beta_s": fit.beta_s,
        "t_intra_s": fit.t_intra_s,
        "t_cross_s": fit.t_cross_s,
    }
    print("GENIE fit vs truth:", {k: (round(v, 6), GENIE_TRUTH[k]) for k, v in fitted.items()}, fit.startup_s)
    for term, value in fitted.items():
        assert value == pytest.approx(GENIE_TRUTH[term], rel=0.10), (term, fitted)
    assert fit.measured == ["alpha", "beta", "t_intra", "t_cross"] and fit.filled == {}
    assert fit.r2 > 0.99 and all(abs(r["error_pct"]) < 3 for r in fit.residuals)
    assert [s["config"] for s in fit.samples] == ["n2k1b32", "n1k1b16", "n1k1b32", "n1k1b64", "n1k2b32"]
    # Start-up as the workload measured it (its 2 s in its own time, plus its own start in that time).
    assert fit.startup_s >= GENIE_TRUTH["startup_s"]

    predictor = workload_predictor(Workload.objects.get(pk=workload.pk))
    assert predictor is not None and predictor.alpha == fit.alpha_s

    # Shown in the API with the workload.
    token = Token.objects.create(user=UserFactory(username="e2e-genie"))
    with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Token {token.key}"}) as client:
        body = client.get("/api/v1/workloads/").json()
    rows = body["results"] if isinstance(body, dict) else body
    (shown,) = [w for w in rows if w["name"] == "genie-cnn"]
    assert shown["genie"]["alpha_s"] == pytest.approx(fit.alpha_s)
    assert shown["genie"]["profiling_run"] == done.pk
    assert all(a.proc.poll() is None for a in agents)
