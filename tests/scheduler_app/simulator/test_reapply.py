"""A reused round applied from its plan's template gives exactly the figures of applying it job by job."""

from __future__ import annotations

import pytest

from scheduler_app.simulator import ClusterSpec, philly_derived_trace, reapply, simulate

CLUSTER = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)


def _figures(**kwargs) -> dict:
    data = simulate(
        philly_derived_trace(150, jobs_per_hour=12.0, multi_gpu=True, seed=7), CLUSTER, **kwargs
    ).to_dict(include_records=True, include_series=True)
    data.pop("wall_s")
    return data


@pytest.mark.parametrize("round_end", [False, True])
@pytest.mark.parametrize(
    ("policy", "allocator"), [("fifo", "tune"), ("swaf", "genie"), ("las", "proportional")]
)
def test_templates_give_the_same_figures(
    monkeypatch: pytest.MonkeyPatch, round_end: bool, policy: str, allocator: str
) -> None:
    runs = {"n": 0}
    real_run = reapply.run

    def counting(*args, **kwargs):
        runs["n"] += 1
        return real_run(*args, **kwargs)

    monkeypatch.setattr(reapply, "run", counting)
    templated = _figures(policy=policy, allocator=allocator, finish_at_round_end=round_end)
    assert runs["n"] > 0
    monkeypatch.setattr(reapply, "build", lambda *args: None)
    runs["n"] = 0
    job_by_job = _figures(policy=policy, allocator=allocator, finish_at_round_end=round_end)
    assert runs["n"] == 0
    assert templated == job_by_job


@pytest.mark.parametrize("round_end", [False, True])
@pytest.mark.parametrize(("policy", "allocator"), [("fifo", "tune"), ("fifo", "proportional")])
def test_adopted_templates_give_the_same_figures(
    monkeypatch: pytest.MonkeyPatch, round_end: bool, policy: str, allocator: str
) -> None:
    """The plan after a job finished (or with arrivals waiting) applied from the last template less
    their rows gives the figures of applying it job by job."""
    adopted = {"n": 0}
    real_adopt = reapply.adopt

    def counting(*args, **kwargs):
        template = real_adopt(*args, **kwargs)
        adopted["n"] += template is not None
        return template

    monkeypatch.setattr(reapply, "adopt", counting)
    with_adoption = _figures(policy=policy, allocator=allocator, finish_at_round_end=round_end)
    assert adopted["n"] > 0
    monkeypatch.setattr(reapply, "adopt", lambda *args: None)
    without = _figures(policy=policy, allocator=allocator, finish_at_round_end=round_end)
    assert with_adoption == without


@pytest.mark.parametrize("round_end", [False, True])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_templates_as_a_plans_first_rows_give_the_same_figures(
    monkeypatch: pytest.MonkeyPatch, round_end: bool, multi_gpu: bool
) -> None:
    """A steady plan extended with arrivals (Allocator.extend) applied as the last template's rows then
    the arrivals one by one, and its own template made from them, gives the figures of applying it
    job by job."""
    prefixed = {"n": 0}
    real_prefix = reapply.adopt_prefix

    def counting(*args, **kwargs):
        covered = real_prefix(*args, **kwargs)
        prefixed["n"] += covered is not None
        return covered

    def figures() -> dict:
        data = simulate(
            philly_derived_trace(150, jobs_per_hour=4.0, multi_gpu=multi_gpu, seed=7),
            CLUSTER,
            policy="fifo",
            allocator="tune",
            finish_at_round_end=round_end,
        ).to_dict(include_records=True, include_series=True)
        data.pop("wall_s")
        return data

    monkeypatch.setattr(reapply, "adopt_prefix", counting)
    with_prefix = figures()
    assert prefixed["n"] > 0
    monkeypatch.setattr(reapply, "adopt_prefix", lambda *args: None)
    assert figures() == with_prefix
