"""The system checks of the node settings: the fence must expire before a silent node counts as DOWN."""

import pytest

from cluster_app.checks import fence_before_node_down


def ids(errors) -> list[str]:
    return [e.id for e in errors]


def test_the_defaults_pass():
    assert fence_before_node_down() == []


def test_a_down_threshold_shorter_than_the_fence_expiry_is_an_error(settings):
    settings.ATTUNE_NODE_DOWN_AFTER_S = 99  # 60 + 30 + 10 = 100
    errors = fence_before_node_down()
    assert ids(errors) == ["attune.E002"] and "(100 s = ATTUNE_LEASE_FENCE_S" in errors[0].msg
    settings.ATTUNE_NODE_DOWN_AFTER_S = 100
    assert fence_before_node_down() == []


@pytest.mark.parametrize(
    ("setting", "value", "error"),
    [
        ("ATTUNE_LEASE_FENCE_S", 0, "attune.E001"),
        ("ATTUNE_LEASE_FENCE_GRACE_S", -1, "attune.E001"),
        ("ATTUNE_LEASE_FENCE_S", 30, "attune.E003"),  # not above NOT_RESPONDING's 30 s
    ],
)
def test_fence_settings_that_cannot_work_are_errors(settings, setting, value, error):
    setattr(settings, setting, value)
    assert error in ids(fence_before_node_down())
