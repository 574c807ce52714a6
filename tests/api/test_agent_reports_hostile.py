"""A buggy or compromised node agent cannot corrupt the schedule (docs/agent-protocol.md section 4).

Each implausible report in a sync is answered 200 with the item in `rejected` (code 400), or cleaned or
clamped where that is the rule; nothing corrupt is stored; the rest of the batch is applied.
"""

import json
import math
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles_app.models import SpeedObservation
from scheduler_app.models import AgentReport, Allocation, Job, JobEvent, JobState
from scheduler_app.services.agents import AGENT_CLOCK_SKEW
from scheduler_app.services.report_apply import SPEED_OUTLIER_FACTOR
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.agent_native import agent_path  # noqa: F401  (the fixture)
from tests.api.helpers import lease_of, submit, synced

# Each test twice: through Django's handler and DRF's view, and through config/agent_calls.py first.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("agent_path")]


@pytest.fixture
def rounds(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
    }


def placed(job: Job) -> Job:
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


@pytest.fixture
def running(user, server, rounds):
    """A res18 job of 1000 iterations on 2 GPUs of gpu01, placed by a real round."""
    return placed(submit(user, gpus=2, iters=1000, name="res18-a"))


@pytest.fixture
def own_unsized(user, server, rounds):
    """An own command without total_iters (sized by its time limit)."""
    return placed(submit(user, gpus=1, iters=None, command="python train.py", time_limit_s=3600, name="own"))


def report(lease, seq, kind, at=None, **data):
    return {
        "lease_id": str(lease),
        "seq": seq,
        "kind": kind,
        "at": (at or timezone.now()).isoformat(),
        "data": data,
    }


def post(agent, reports):
    """One sync carrying `reports`, sent as JSON text (escaped, so that lone surrogates and NUL travel as
    JSON can carry them); its answer."""
    return synced(agent, reports=reports)


def rejected(body) -> dict[int, str]:
    return {r["seq"]: r["error"] for r in body["rejected"] if r["code"] == 400}


def acked(body) -> set[int]:
    return {seq for _, seq in body["acked"]}


# --- text ---------------------------------------------------------------------------------------------


def test_nul_and_lone_surrogates_in_log_lines_are_replaced_not_stored_raw(agent, running):
    lease = lease_of(running).lease_id
    body = post(agent, [report(lease, 1, "log", lines=["a\x00b", "bad \ud800 utf-8", "fine"])])
    assert acked(body) == {1} and body["rejected"] == []
    tail = lease_of(running).log_tail
    assert tail == "a\ufffdb\nbad \ufffd utf-8\nfine"
    stored = AgentReport.objects.get(lease_id=lease, seq=1).data
    assert "\x00" not in json.dumps(stored, ensure_ascii=False)
    assert stored["lines"][0] == "a\ufffdb"


def test_nul_anywhere_in_a_reports_data_is_cleaned_keys_included(agent, running):
    lease = lease_of(running).lease_id
    nested = {"isolation": "affinity\x00", "deep": [{"k\x00": ["v\x00"]}], "pid": 7}
    body = post(agent, [report(lease, 1, "started", **nested)])
    assert acked(body) == {1}
    stored = AgentReport.objects.get(lease_id=lease, seq=1).data
    assert stored == {"isolation": "affinity\ufffd", "deep": [{"k\ufffd": ["v\ufffd"]}], "pid": 7}
    event = JobEvent.objects.get(job=running, kind="lease_started")
    assert event.reason == "affinity\ufffd" and event.data["deep"] == [{"k\ufffd": ["v\ufffd"]}]


def test_an_exit_error_with_nul_fails_the_job_with_the_cleaned_message(agent, running):
    lease = lease_of(running).lease_id
    post(agent, [report(lease, 1, "exited", exit_code=None, error="start failed: \x00boom")])
    running.refresh_from_db()
    assert running.state == JobState.FAILED
    failed = JobEvent.objects.filter(job=running, to_state=JobState.FAILED).get()
    assert failed.message == "start failed: \ufffdboom"


def test_an_overlong_stop_or_isolation_does_not_overflow_their_columns(agent, running):
    lease = lease_of(running).lease_id
    body = post(
        agent,
        [
            report(lease, 1, "started", isolation="x" * 500),
            report(lease, 2, "exited", exit_code=None, signal=15, stop="s" * 500),
        ],
    )
    assert acked(body) == {1, 2}
    running.refresh_from_db()
    assert running.state == JobState.PENDING  # requeued: the agent stopped it


# --- exit codes and signals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        {"exit_code": 99999},
        {"exit_code": -1},
        {"exit_code": 256},
        {"exit_code": True},
        {"exit_code": None, "signal": -9},
        {"exit_code": None, "signal": 0},
        {"exit_code": None, "signal": 65},
        {"exit_code": 1.5},
    ],
)
def test_exit_codes_outside_0_255_and_signals_outside_1_64_are_rejected(agent, running, data):
    lease = lease_of(running).lease_id
    body = post(agent, [report(lease, 1, "progress", done_iters=10), report(lease, 2, "exited", **data)])
    assert acked(body) == {1} and set(rejected(body)) == {2}
    assert "exit_code" in rejected(body)[2] or "signal" in rejected(body)[2]
    running.refresh_from_db()
    assert running.state == JobState.RUNNING and running.done_iters == 10  # the rest applied
    assert lease_of(running).exit_code is None
    assert not AgentReport.objects.filter(lease_id=lease, seq=2).exists()


@pytest.mark.parametrize(
    ("data", "stored"), [({"exit_code": 255}, 255), ({"exit_code": None, "signal": 64}, 192)]
)
def test_the_extreme_valid_exit_statuses_are_accepted(agent, running, data, stored):
    allocation = lease_of(running)
    body = post(agent, [report(allocation.lease_id, 1, "exited", **data)])
    assert acked(body) == {1}
    allocation.refresh_from_db()
    running.refresh_from_db()
    assert allocation.exit_code == stored and running.state == JobState.FAILED


# --- progress -----------------------------------------------------------------------------------------


def test_done_iters_above_the_total_is_clamped_and_the_clamp_recorded(agent, running):
    lease = lease_of(running).lease_id
    body = post(agent, [report(lease, 1, "progress", done_iters=1_000_000)])
    assert acked(body) == {1}
    running.refresh_from_db()
    assert running.done_iters == 1000
    event = JobEvent.objects.get(job=running, kind="progress_clamped")
    assert event.data["reported_done_iters"] == 1_000_000 and event.data["total_iters"] == 1000
    # ... on the exit path too, and it never goes backwards.
    post(
        agent,
        [
            report(lease, 2, "progress", done_iters=5),
            report(lease, 3, "exited", exit_code=0, done_iters=10**9),
        ],
    )
    running.refresh_from_db()
    assert running.done_iters == 1000 and running.state == JobState.COMPLETED
    assert JobEvent.objects.filter(job=running, kind="progress_clamped").count() == 2


def test_a_job_without_a_total_keeps_the_highest_progress(agent, own_unsized):
    lease = lease_of(own_unsized).lease_id
    post(
        agent,
        [report(lease, 1, "progress", done_iters=1_000_000), report(lease, 2, "progress", done_iters=7)],
    )
    own_unsized.refresh_from_db()
    assert own_unsized.done_iters == 1_000_000
    assert not JobEvent.objects.filter(job=own_unsized, kind="progress_clamped").exists()


@pytest.mark.parametrize("done", [-1, "NaN", "12", 10**30, True])
def test_malformed_done_iters_is_rejected(agent, running, done):
    lease = lease_of(running).lease_id
    body = post(
        agent, [report(lease, 1, "progress", done_iters=done), report(lease, 2, "progress", done_iters=3)]
    )
    assert set(rejected(body)) == {1} and acked(body) == {2}
    running.refresh_from_db()
    assert running.done_iters == 3


# --- speeds -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ips", [-3, "fast", "NaN"])
def test_a_negative_or_non_numeric_speed_is_rejected(agent, running, ips):
    lease = lease_of(running).lease_id
    body = post(agent, [report(lease, 1, "progress", done_iters=5, iters_per_s=ips)])
    assert set(rejected(body)) == {1} and "iters_per_s" in rejected(body)[1]
    assert lease_of(running).iters_per_s is None


def test_a_speed_of_zero_means_not_measured_and_is_not_stored(agent, running):
    lease = lease_of(running).lease_id
    predicted = lease_of(running).speedup / running.workload.iter_time_s
    post(agent, [report(lease, 1, "progress", done_iters=5, iters_per_s=predicted)])
    post(agent, [report(lease, 2, "progress", done_iters=6, iters_per_s=0)])
    assert lease_of(running).iters_per_s == pytest.approx(predicted)  # the last real measurement stays


@pytest.mark.parametrize("factor", [1e308, SPEED_OUTLIER_FACTOR * 2, 1 / (SPEED_OUTLIER_FACTOR * 2)])
def test_a_speed_far_from_the_profiles_prediction_is_an_outlier_not_a_measurement(agent, running, factor):
    allocation = lease_of(running)
    predicted = allocation.speedup / running.workload.iter_time_s
    ips = 1e308 if factor == 1e308 else predicted * factor
    body = post(agent, [report(allocation.lease_id, 1, "progress", done_iters=5, iters_per_s=ips)])
    assert acked(body) == {1}
    allocation.refresh_from_db()
    running.refresh_from_db()
    assert allocation.iters_per_s is None and running.done_iters == 5  # the progress itself counts
    assert not SpeedObservation.objects.filter(job_id=running.pk).exists()
    event = JobEvent.objects.get(job=running, kind="speed_outlier")
    assert float(event.data["reported_iters_per_s"]) == pytest.approx(ips)


def test_a_plausible_speed_is_stored_and_observed(agent, running):
    allocation = lease_of(running)
    predicted = allocation.speedup / running.workload.iter_time_s
    post(agent, [report(allocation.lease_id, 1, "progress", done_iters=5, iters_per_s=predicted / 2)])
    allocation.refresh_from_db()
    assert allocation.iters_per_s == pytest.approx(predicted / 2)
    assert not JobEvent.objects.filter(job=running, kind="speed_outlier").exists()


def test_an_absurd_speed_of_an_own_command_is_not_stored(agent, own_unsized):
    lease = lease_of(own_unsized).lease_id
    post(agent, [report(lease, 1, "progress", done_iters=5, iters_per_s=1e308)])
    assert lease_of(own_unsized).iters_per_s is None
    assert JobEvent.objects.filter(job=own_unsized, kind="speed_outlier").exists()


@pytest.mark.parametrize("scale", [0, -1, "x"])
def test_a_time_scale_that_is_not_positive_rejects_the_report(agent, running, scale):
    lease = lease_of(running).lease_id
    body = post(agent, [report(lease, 1, "progress", done_iters=5, iters_per_s=1.0, time_scale=scale)])
    assert set(rejected(body)) == {1} and "time_scale" in rejected(body)[1]
    running.refresh_from_db()
    assert running.done_iters == 0


# --- dates --------------------------------------------------------------------------------------------


def test_a_report_dated_in_the_future_is_dated_back_and_adds_no_more_than_the_wall_time(agent, running):
    allocation = lease_of(running)
    lease = allocation.lease_id
    t0 = timezone.now()
    post(
        agent,
        [
            report(lease, 1, "started", at=t0),
            report(lease, 2, "progress", at=t0 + timedelta(seconds=7), done_iters=1),
        ],
    )
    running.refresh_from_db()
    assert running.attained_service_gpu_s == pytest.approx(2 * 7.0)
    body = post(
        agent,
        [
            report(lease, 3, "progress", at=t0 + timedelta(seconds=10_000_000), done_iters=2),
            report(lease, 4, "log", lines=["still here"]),
        ],
    )
    assert rejected(body) == {} and acked(body) == {3, 4}
    running.refresh_from_db()
    wall_s = (timezone.now() - allocation.started_at + AGENT_CLOCK_SKEW).total_seconds()
    assert running.done_iters == 2 and running.attained_service_gpu_s <= 2 * wall_s  # not 10,000,007 s
    stored = AgentReport.objects.get(lease_id=lease, seq=3)
    assert stored.at <= timezone.now() + AGENT_CLOCK_SKEW
    assert stored.data["agent_at"] == (t0 + timedelta(seconds=10_000_000)).isoformat()
    assert lease_of(running).log_tail == "still here"
    # A wrong clock never costs the job its end: the exit, dated in the future too, still applies.
    post(agent, [report(lease, 5, "exited", at=t0 + timedelta(days=30), exit_code=0, done_iters=1000)])
    running.refresh_from_db()
    assert running.state == "COMPLETED" and running.attained_service_gpu_s <= 2 * wall_s + 1


def test_a_report_dated_before_the_lease_started_counts_from_its_start(agent, running):
    allocation = lease_of(running)
    long_ago = allocation.started_at - AGENT_CLOCK_SKEW - timedelta(days=1)
    body = post(agent, [report(allocation.lease_id, 1, "started", at=long_ago)])
    assert rejected(body) == {} and acked(body) == {1}
    allocation.refresh_from_db()
    assert allocation.accounted_until == allocation.started_at


def test_a_lagging_agent_clock_is_not_credited_before_the_lease_started(agent, running):
    allocation = lease_of(running)
    lag = AGENT_CLOCK_SKEW / 2
    post(agent, [report(allocation.lease_id, 1, "started", at=allocation.started_at - lag)])
    allocation.refresh_from_db()
    assert allocation.accounted_until == allocation.started_at


# --- the database's own guard -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "values"),
    [
        (Allocation, {"iters_per_s": 0.0}),
        (Allocation, {"iters_per_s": -1.0}),
        (Allocation, {"iters_per_s": math.inf}),
        (Allocation, {"iters_per_s": math.nan}),
        (Allocation, {"exit_code": 256}),
        (Allocation, {"exit_code": -9}),
        (Job, {"done_iters": 1001}),
    ],
)
def test_postgresql_refuses_what_the_service_would_never_store(running, model, values):
    rows = model.objects.filter(pk=running.pk) if model is Job else model.objects.filter(job=running)
    with pytest.raises(IntegrityError), transaction.atomic():
        rows.update(**values)


def test_a_job_without_a_total_may_hold_any_progress(own_unsized):
    Job.objects.filter(pk=own_unsized.pk).update(done_iters=10**15)


# --- random hostile sequences -------------------------------------------------------------------------

_numbers = st.one_of(
    st.none(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=0, max_value=2000),  # plausible progress and speeds, stored when believable
    st.sampled_from(["NaN", "Infinity", "-1", "", True]),
)
_text = st.lists(
    st.text(alphabet=st.sampled_from(["a", "é", "\x00", "\ud800", "\udfff", "\n", "😀"]), max_size=8),
    max_size=4,
)
_offsets = st.one_of(
    st.integers(min_value=-120, max_value=120),
    st.integers(min_value=-(10**8), max_value=10**8),
)
_report = st.one_of(
    st.fixed_dictionaries(
        {"kind": st.just("progress"), "offset": _offsets},
        optional={"done_iters": _numbers, "iters_per_s": _numbers, "time_scale": _numbers},
    ),
    st.fixed_dictionaries({"kind": st.just("log"), "offset": _offsets, "lines": _text}),
    st.fixed_dictionaries(
        {"kind": st.just("started"), "offset": _offsets},
        optional={"isolation": st.text(max_size=100), "junk": _text},
    ),
    st.fixed_dictionaries(
        {
            "kind": st.just("exited"),
            "offset": _offsets,
            "exit_code": st.one_of(st.none(), st.integers(min_value=-(10**6), max_value=10**6)),
            "signal": st.one_of(st.none(), st.integers(min_value=-100, max_value=100)),
        },
        optional={"oom": st.booleans(), "error": st.text(max_size=20), "done_iters": _numbers},
    ),
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(_report, min_size=1, max_size=6), min_size=1, max_size=4))
def test_random_hostile_reports_never_corrupt_the_schedule(agent, running, batches):
    allocation = lease_of(running)
    lease = allocation.lease_id
    gpus = allocation.gpu_holds.count()
    with transaction.atomic():  # each example starts from the freshly placed job
        seq = 0
        for batch in batches:
            items = []
            for spec in batch:
                seq += 1
                data = {k: v for k, v in spec.items() if k not in ("kind", "offset")}
                at = timezone.now() + timedelta(seconds=spec["offset"])
                items.append(report(lease, seq, spec["kind"], at=at, **data))
            body = post(agent, items)
            assert acked(body) | set(rejected(body)) == {item["seq"] for item in items}
            for seq_rejected in rejected(body):
                assert not AgentReport.objects.filter(lease_id=lease, seq=seq_rejected).exists()
            job = Job.objects.get(pk=running.pk)
            assert job.total_iters is None or 0 <= job.done_iters <= job.total_iters
            now = timezone.now()
            bound = sum(
                ((now - a.started_at + AGENT_CLOCK_SKEW).total_seconds()) * a.gpu_holds.count()
                for a in Allocation.objects.filter(job=job)
            )
            assert 0 <= job.attained_service_gpu_s <= bound + 1e-6
            for ips in Allocation.objects.filter(job=job).values_list("iters_per_s", flat=True):
                assert ips is None or (math.isfinite(ips) and ips > 0)
            for data in AgentReport.objects.filter(lease_id=lease).values_list("data", flat=True):
                assert "\\u0000" not in json.dumps(data)
        assert gpus > 0
        transaction.set_rollback(True)
