"""The simulator with GENIE's predictor in the loop: synthetic fits per model, per-job batch sizes."""

from __future__ import annotations

import pytest

from profiles_app.catalog import batch_size_for, load_catalog
from scheduler_app.core.throughput import job_profile, placement_slowdown
from scheduler_app.simulator import ClusterSpec, genie_trace, simulate, standalone_best_s
from scheduler_app.simulator.genie_fits import fitted_name, synthetic_predictor
from scheduler_app.simulator.workloads import genie_fitted_catalog

CATALOG = load_catalog()


def test_a_synthetic_fit_keeps_the_catalog_time_and_costs_what_its_class_communicates():
    res18, gnmt = CATALOG["res18"], CATALOG["gnmt"]
    fit = synthetic_predictor(res18, 512)
    assert fit.iter_time_s(1, 1, 512) == pytest.approx(res18.iter_time_s)  # the catalog's own time
    assert fit.iter_time_s(1, 1, 256) == pytest.approx(0.6 * res18.iter_time_s)  # 0.8 T / 2 + 0.2 T
    fitted = genie_fitted_catalog()
    image, language = fitted[fitted_name("res18", 512)], fitted[fitted_name("gnmt", 128)]
    assert placement_slowdown(image, 8, 2) == pytest.approx(1.3 / 1.075)
    assert placement_slowdown(language, 8, 2) == pytest.approx(1.6 / 1.15)
    assert job_profile(language, 8).iter_time_s == pytest.approx(1.15 * gnmt.iter_time_s)
    assert {fitted_name("res18", b) for b in (256, 512, 1024)} <= set(fitted)
    assert "res18" in fitted and fitted["res18"].predictor is None  # plain names stay unfitted


def test_batch_factors_draw_a_batch_per_job_and_leave_the_rest_of_the_trace_alone():
    plain = genie_trace(60, jobs_per_hour=3, seed=5)
    fitted = genie_trace(60, jobs_per_hour=3, seed=5, batch_factors=(0.5, 1.0, 2.0))
    assert genie_trace(60, jobs_per_hour=3, seed=5, batch_factors=()) == plain  # no factors: as before
    assert [(j.arrival_s, j.num_gpus) for j in fitted] == [(j.arrival_s, j.num_gpus) for j in plain]
    catalog = genie_fitted_catalog()
    batches = set()
    for plain_job, job in zip(plain, fitted, strict=True):
        model, _, batch = job.model.partition("@b")
        assert model == plain_job.model
        batches.add(float(batch) / batch_size_for(model))
        profile = catalog[job.model]
        best_s = standalone_best_s(profile, job.total_iters, job.num_gpus)
        # The latency is f x the fitted standalone time, f in GENIE's ranges (urgent jobs: 1.05-1.3).
        assert 1.05 - 1e-9 <= (job.deadline_s - job.arrival_s) / best_s <= 4.0 + 1e-9
    assert batches == {0.5, 1.0, 2.0}


def test_the_predictor_in_the_loop_runs_every_scheduler_to_completion():
    trace = genie_trace(30, jobs_per_hour=4, seed=2, batch_factors=(0.5, 1.0, 2.0))
    catalog = genie_fitted_catalog()
    cluster = ClusterSpec(servers=2)
    for policy, allocator in (("swaf", "genie"), ("edf", "proportional"), ("sjf", "tune")):
        result = simulate(trace, cluster, policy=policy, allocator=allocator, catalog=catalog)
        assert result.finished_jobs == 30 and result.qos.jobs == 30
