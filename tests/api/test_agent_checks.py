"""The sync's hand-written checks (scheduler_app/api/agent_checks.py) agree with the serializers: on
every body and report they accept, the same validated data; what they do not accept is left to the
serializers (None), malformed or merely unusual. Each field of a well-formed body is replaced in turn
by odd values (wrong JSON types, bounds, strings DRF would trim, coerce or refuse)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
from rest_framework.exceptions import ValidationError

from scheduler_app.api.agent_checks import _report, reports_check_fast, sync_body_check
from scheduler_app.api.agent_views import REPORT_CHECKER, SYNC_CHECKER
from scheduler_app.api.serializers.agents import reports_check

LEASE = str(uuid.uuid4())
AT = "2026-11-29T08:00:00.123456+00:00"
ODD_VALUES: list[Any] = [
    None, "", " ", "1", "x", True, False, 0, -1, 1, 100, 101, 1.5, -0.5, 2**60, 10**400, [], {}, [1, 2],
    " padded ", "nul\x00", "é", "\ud800", "a" * 65, "2026-11-29", "2026-11-29T08:00:00", AT,
    LEASE, LEASE.replace("-", ""), LEASE.upper(), "{" + LEASE + "}", 5 * 10**6, 10**7 + 1,
]  # fmt: skip


def good_body() -> dict[str, Any]:
    gpus = [{"uuid": f"GPU-{i}", "util_pct": 50.0, "mem_used_mb": 1000} for i in range(3)]
    return {
        "sample": {"sampled_at": AT, "cpu_util_pct": 40, "mem_used_gb": 100.5, "gpus": gpus},
        "running": [LEASE, str(uuid.uuid4())],
        "sizes": {LEASE: [4, 32.0]},
        "reports": [good_report(), None, "junk", {"lease_id": LEASE}],
    }


def good_report(kind: str = "progress") -> dict[str, Any]:
    data = {"done_iters": 10, "iters_per_s": 2.5, "text": "a\x00b"}
    if kind == "exited":
        data = {"exit_code": 0, "signal": None, "done_iters": 10}
    return {"lease_id": LEASE, "seq": 3, "kind": kind, "at": AT, "data": data}


def serializer_result(checker, data: Any) -> Any:
    try:
        return checker.run_validation(copy.deepcopy(data))
    except ValidationError:
        return "refused"


def assert_agrees_on_body(body: Any) -> None:
    fast = sync_body_check(copy.deepcopy(body), SYNC_CHECKER)
    if fast is not None:
        assert fast == serializer_result(SYNC_CHECKER, body), body


def assert_agrees_on_report(item: Any) -> None:
    fast = _report(copy.deepcopy(item), REPORT_CHECKER)
    if fast is not None:
        assert fast == serializer_result(REPORT_CHECKER, item), item


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into nested dicts and lists."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*prefix, i))
    return found


def replaced(value: Any, path: tuple, new: Any) -> Any:
    value = copy.deepcopy(value)
    target = value
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return value


def removed(value: Any, path: tuple) -> Any:
    value = copy.deepcopy(value)
    target = value
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return value


def test_a_well_formed_body_is_checked_by_hand_with_the_serializers_result():
    body = good_body()
    fast = sync_body_check(copy.deepcopy(body), SYNC_CHECKER)
    assert fast is not None and fast == serializer_result(SYNC_CHECKER, body)
    assert sync_body_check({"sample": body["sample"]}, SYNC_CHECKER) == serializer_result(
        SYNC_CHECKER, {"sample": body["sample"]}
    )


@pytest.mark.parametrize("kind", ["started", "progress", "log", "exited"])
def test_a_well_formed_report_is_checked_by_hand_with_the_serializers_result(kind):
    item = good_report(kind)
    if kind in ("started", "log"):
        item["data"] = {"lines": ["one", "two"]} if kind == "log" else {}
    fast = _report(copy.deepcopy(item), REPORT_CHECKER)
    assert fast is not None and fast == serializer_result(REPORT_CHECKER, item)
    assert "\x00" not in fast["data"].get("text", "")  # cleaned of NUL as the serializer cleans it


def test_every_odd_value_anywhere_in_a_body_is_accepted_alike_or_left_to_the_serializer():
    body = good_body()
    for path in paths(body):
        assert_agrees_on_body(removed(body, path))
        for odd in ODD_VALUES:
            assert_agrees_on_body(replaced(body, path, odd))
    for odd in ODD_VALUES:
        assert_agrees_on_body(odd)


def test_every_odd_value_anywhere_in_a_report_is_accepted_alike_or_left_to_the_serializer():
    for kind in ("progress", "exited", "log", "nonsense"):
        item = good_report(kind)
        for path in paths(item):
            assert_agrees_on_report(removed(item, path))
            for odd in ODD_VALUES:
                assert_agrees_on_report(replaced(item, path, odd))


def test_malformed_input_is_left_to_the_serializer():
    body = good_body()
    assert sync_body_check(replaced(body, ("sample", "cpu_util_pct"), 101), SYNC_CHECKER) is None
    assert sync_body_check(replaced(body, ("sample", "gpus", 0, "uuid"), " GPU-0"), SYNC_CHECKER) is None
    assert sync_body_check(replaced(body, ("running", 0), "not a lease"), SYNC_CHECKER) is None
    assert sync_body_check(replaced(body, ("sizes",), {LEASE: [1]}), SYNC_CHECKER) is None
    assert _report(replaced(good_report(), ("seq",), "3"), REPORT_CHECKER) is None
    assert _report(replaced(good_report(), ("data", "done_iters"), "10"), REPORT_CHECKER) is None
    assert _report(replaced(good_report("exited"), ("data", "exit_code"), 256), REPORT_CHECKER) is None


def test_a_batch_is_checked_in_order_with_the_serializers_rejections():
    items = [good_report(), None, replaced(good_report(), ("seq",), -1), good_report("exited"), 7]
    items.append(replaced(good_report(), ("lease_id",), "nope"))
    assert reports_check_fast(copy.deepcopy(items), checker=REPORT_CHECKER) == reports_check(
        copy.deepcopy(items), checker=REPORT_CHECKER
    )
