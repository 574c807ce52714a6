"""The aging settings reach the configured policy (scheduler_app/conf.py), as the live round builds it."""

from __future__ import annotations

import pytest

from scheduler_app.conf import scheduler_conf
from scheduler_app.core.policies.aging import DEFAULT_AGING, Aging


@pytest.fixture
def scheduler(settings):
    def configure(**knobs):
        settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, **knobs}
        return scheduler_conf()

    return configure


@pytest.mark.parametrize("policy", ["swaf", "sjf", "srtf"])
def test_the_configured_rule_reaches_the_shortest_first_policies(scheduler, policy):
    conf = scheduler(policy=policy, aging_factor=2.0, aging_floor_h=0.5, aging_max_wait_h=10.0)
    assert conf.policy_obj().aging == Aging(factor=2.0, floor_s=1800.0, max_wait_s=36_000.0)


def test_the_defaults_are_the_documented_ones(scheduler):
    conf = scheduler(policy="swaf")
    assert conf.aging == DEFAULT_AGING == Aging(factor=4.0, floor_s=3600.0, max_wait_s=None)


def test_a_factor_of_zero_turns_aging_off(scheduler):
    assert scheduler(policy="swaf", aging_factor=0).policy_obj().aging is None


def test_a_policy_without_aging_is_built_without_it(scheduler):
    assert scheduler(policy="fifo", aging_factor=2.0).policy_obj().name == "fifo"
