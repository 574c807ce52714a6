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
