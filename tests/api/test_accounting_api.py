"""Accounting (sacct/sreport): the selector's sums against the rows, the endpoint's JSON and CSV,
who sees which rows, and bad parameters."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler_app.api.serializers.accounting import AccountingJobsSerializer
from scheduler_app.models import JobState
from scheduler_app.selectors import END_STATES, NO_TEAM, accounting_report
from tests.api.accounting_data import H, Ledger, expected
from tests.api.helpers import make_server
from tests.factories import JobFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/accounting/"


@pytest.fixture
def people():
    alice, bob, carol = (UserFactory(username=name) for name in ("alice", "bob", "carol"))
    vision, nlp = TeamFactory(name="vision"), TeamFactory(name="nlp")
    vision.members.add(alice, bob)
    nlp.members.add(carol)
    return SimpleNamespace(alice=alice, bob=bob, carol=carol, vision=vision, nlp=nlp)


@pytest.fixture
def scenario(people):
    """Jobs around a 10-hour window [t0, t0 + 10 h) two days ago; one allocation still runs now.

    alice: a 2-GPU job that started before the window (3 h inside), a teamless 1-GPU job (1 h).
    bob: a job on two servers (4 + 4 GPUs, 2 h inside, ends after it), a job preempted once (two
    2-GPU allocations), a 1-GPU job still running (started 1 h before the window's end).
    carol: a job entirely before the window, and one cancelled while pending (no usage).
    """
    t0 = (timezone.now() - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    gpu01, gpu02 = make_server("gpu01", gpus=8, cpus=32, mem_gb=512), make_server("gpu02", gpus=8)
    p, led = people, Ledger()
    a1 = led.job(
        p.alice, team=p.vision, submitted_at=t0 - 2.5 * H, started_at=t0 - 2 * H, finished_at=t0 + 3 * H
    )
    led.allocation(a1, gpu01, gpus=2, cpus=6, mem_gb=100, started_at=t0 - 2 * H, ended_at=t0 + 3 * H)
    a2 = led.job(
        p.alice, state=JobState.FAILED, submitted_at=t0 + 0.5 * H, started_at=t0 + H, finished_at=t0 + 2 * H
    )
    led.allocation(a2, gpu02, gpus=1, cpus=4, mem_gb=20, started_at=t0 + H, ended_at=t0 + 2 * H)
    b1 = led.job(
        p.bob, team=p.vision, submitted_at=t0 + 7 * H, started_at=t0 + 8 * H, finished_at=t0 + 12 * H
    )
    for server in (gpu01, gpu02):
        led.allocation(b1, server, gpus=4, cpus=12, mem_gb=200, started_at=t0 + 8 * H, ended_at=t0 + 12 * H)
    b2 = led.job(
        p.bob, team=p.vision, state=JobState.TIMEOUT, submitted_at=t0 + 0.25 * H, started_at=t0 + H,
        finished_at=t0 + 4 * H,
    )  # fmt: skip
    led.allocation(b2, gpu01, gpus=2, cpus=5, mem_gb=40.5, started_at=t0 + H, ended_at=t0 + 2 * H)
    led.allocation(b2, gpu02, gpus=2, cpus=5, mem_gb=40.5, started_at=t0 + 3 * H, ended_at=t0 + 4 * H)
    b3 = led.job(
        p.bob, team=p.vision, state=JobState.RUNNING, submitted_at=t0 + 8.5 * H, started_at=t0 + 9 * H
    )
    led.allocation(b3, gpu01, gpus=1, cpus=3, mem_gb=62.5, started_at=t0 + 9 * H)
    c1 = led.job(
        p.carol, team=p.nlp, state=JobState.CANCELLED, submitted_at=t0 - 6 * H, started_at=t0 - 5 * H,
        finished_at=t0 - H,
    )  # fmt: skip
    led.allocation(c1, gpu02, gpus=3, cpus=9, mem_gb=90, started_at=t0 - 5 * H, ended_at=t0 - H)
    led.job(p.carol, team=p.nlp, state=JobState.CANCELLED, submitted_at=t0 + H, finished_at=t0 + 4 * H)
    return SimpleNamespace(ledger=led, t0=t0, window=(t0, t0 + 10 * H), **vars(people))


def as_dict(row) -> dict:
    return {k: getattr(row, k) for k in ("name", "gpu_hours", "cpu_core_hours", "mem_gb_hours", "jobs",
                                         "jobs_total", "mean_wait_s", "p95_wait_s")}  # fmt: skip


def assert_rows_equal(rows: list[dict], want: dict[str, dict], *, abs_h: float = 1e-9) -> None:
    assert [r["name"] for r in rows] == sorted(want, key=lambda n: (-want[n]["gpu_hours"], n))
    for row in rows:
        w = want[row["name"]]
        for column in ("gpu_hours", "cpu_core_hours", "mem_gb_hours"):
            assert row[column] == pytest.approx(w[column], abs=abs_h), (row["name"], column)
        for column in ("mean_wait_s", "p95_wait_s"):
            assert row[column] == (None if w[column] is None else pytest.approx(w[column])), column
        assert row["jobs"] == w["jobs"] and row["jobs_total"] == w["jobs_total"]


# --- The selector, with a fixed clock ------------------------------------------------------------------


@pytest.mark.parametrize("by", ["user", "team"])
def test_sums_over_the_window_equal_those_computed_from_the_rows(scenario, by):
    start, end = scenario.window
    now = scenario.t0 + 50 * H  # the running allocation counts up to the window's end
    report = accounting_report(start=start, end=end, by=by, now=now)
    rows = [as_dict(r) for r in report.rows]
    want = expected(scenario.ledger, start=start, end=end, now=now, by=by)
    assert_rows_equal(rows, want)
    assert (report.start, report.end, report.by) == (start, end, by)


def test_the_figures_by_hand(scenario):
    """The same scenario, spelled out: what the rows make, so that the helper itself is checked."""
    start, end = scenario.window
    report = accounting_report(start=start, end=end, by="user", now=scenario.t0 + 50 * H)
    by_name = {r.name: as_dict(r) for r in report.rows}
    alice, bob, carol = by_name["alice"], by_name["bob"], by_name["carol"]
    # bob: 2 servers x 4 GPUs x 2 h, 2 x (2 GPUs x 1 h) preempted and restarted, 1 GPU x 1 h running.
    assert bob["gpu_hours"] == pytest.approx(16 + 4 + 1)
    assert bob["cpu_core_hours"] == pytest.approx(2 * 12 * 2 + 2 * 5 + 3)
    assert bob["mem_gb_hours"] == pytest.approx(2 * 200 * 2 + 2 * 40.5 + 62.5)
    assert bob["jobs"] == {**dict.fromkeys(END_STATES, 0), "TIMEOUT": 1} and bob["jobs_total"] == 1
    # Waits of the jobs that started in the window: 45, 60 and 30 min; p95 interpolates 60 and 45 min.
    assert bob["mean_wait_s"] == pytest.approx(2700)
    assert bob["p95_wait_s"] == pytest.approx(2700 + 0.9 * 900)
    # alice: 3 h of a 2-GPU job that started before the window, 1 h of a 1-GPU one.
    assert alice["gpu_hours"] == pytest.approx(7)
    assert alice["jobs"]["COMPLETED"] == 1 and alice["jobs"]["FAILED"] == 1
    assert alice["mean_wait_s"] == alice["p95_wait_s"] == pytest.approx(1800)  # a1 started before
    # carol: no usage in the window, one job cancelled while pending, no start.
    assert carol == {
        "name": "carol", "gpu_hours": 0.0, "cpu_core_hours": 0.0, "mem_gb_hours": 0.0,
        "jobs": {**dict.fromkeys(END_STATES, 0), "CANCELLED": 1}, "jobs_total": 1,
        "mean_wait_s": None, "p95_wait_s": None,
    }  # fmt: skip
    assert [r.name for r in report.rows] == ["bob", "alice", "carol"]


def test_a_running_allocation_counts_until_now_inside_the_window(scenario):
    start, end = scenario.t0 + 9.5 * H, scenario.t0 + 100 * H
    now = scenario.t0 + 9.75 * H
    (bob,) = accounting_report(start=start, end=end, by="user", now=now).rows
    # b1's 8 GPUs and b3's 1 GPU, from 9.5 h to now (9.75 h).
    assert bob.gpu_hours == pytest.approx(9 * 0.25)


def test_teams_with_no_team_shown_as_such(scenario):
    start, end = scenario.window
    names = [r.name for r in accounting_report(start=start, end=end, by="team", now=end).rows]
    assert names == ["vision", NO_TEAM, "nlp"]


def test_p95_on_sqlite_is_computed_in_python_and_agrees(scenario, monkeypatch):
    start, end = scenario.window
    on_postgres = accounting_report(start=start, end=end, by="user", now=end).rows
    monkeypatch.setattr("scheduler_app.selectors.accounting.is_postgresql", lambda: False)
    on_sqlite = accounting_report(start=start, end=end, by="user", now=end).rows
    assert [(r.name, r.mean_wait_s, r.p95_wait_s) for r in on_sqlite] == [
        (r.name, pytest.approx(r.mean_wait_s), pytest.approx(r.p95_wait_s)) for r in on_postgres
    ]


def test_the_report_costs_five_queries_whatever_the_rows(scenario, django_assert_num_queries):
    start, end = scenario.window
    # Usage, end states, waits, GPU time lost to restarts per day (one grouped query each) and the names.
    with django_assert_num_queries(5):
        accounting_report(start=start, end=end, by="team", now=end)


def test_a_window_in_the_future_has_no_usage(scenario):
    now = timezone.now()
    assert accounting_report(start=now + H, end=now + 2 * H, now=now).rows == []


def test_the_schema_names_every_end_state():
    assert tuple(AccountingJobsSerializer().fields) == END_STATES


# --- The endpoint ---------------------------------------------------------------------------------------


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def window_query(scenario) -> dict[str, str]:
    start, end = scenario.window
    return {"start": start.isoformat(), "end": end.isoformat()}


def test_staff_see_every_row_as_documented(scenario, staff_user):
    body = client_for(staff_user).get(URL, {**window_query(scenario), "by": "team"}).json()
    start, end = scenario.window
    assert set(body) == {"start", "end", "by", "rows", "restart_loss_by_day"} and body["by"] == "team"
    assert body["start"] == start.isoformat().replace("+00:00", "Z")
    want = expected(scenario.ledger, start=start, end=end, now=timezone.now(), by="team")
    assert_rows_equal(body["rows"], want)
    assert set(body["rows"][0]) == {
        "name", "gpu_hours", "cpu_core_hours", "mem_gb_hours", "jobs", "jobs_total", "mean_wait_s",
        "p95_wait_s",
    }  # fmt: skip


def test_a_named_window_ends_now_and_counts_the_running_allocation(scenario, staff_user):
    before = timezone.now()
    rows = client_for(staff_user).get(URL, {"window": "30d"}).json()["rows"]
    after = timezone.now()
    low = expected(scenario.ledger, start=after - timedelta(days=30), end=before, now=before, by="user")
    high = expected(scenario.ledger, start=before - timedelta(days=30), end=after, now=after, by="user")
    bob = next(r for r in rows if r["name"] == "bob")
    # The running allocation grows while the request runs: its figure lies between the two clocks.
    assert low["bob"]["gpu_hours"] - 1e-9 <= bob["gpu_hours"] <= high["bob"]["gpu_hours"] + 1e-9
    assert bob["gpu_hours"] > 16 + 4 + 40  # b3 has run for more than 40 h on one GPU
    assert_rows_equal([r for r in rows if r["name"] != "bob"], {k: v for k, v in low.items() if k != "bob"})


def test_the_default_is_the_last_30_days_by_user(scenario, staff_user):
    body = client_for(staff_user).get(URL).json()
    assert body["by"] == "user"
    start, end = (datetime.fromisoformat(body[k]) for k in ("start", "end"))
    assert end - start == timedelta(days=30) and abs(timezone.now() - end) < timedelta(minutes=1)


def test_users_see_their_own_row_and_their_teams(scenario):
    q = window_query(scenario)
    assert [r["name"] for r in client_for(scenario.alice).get(URL, q).json()["rows"]] == ["alice"]
    # alice's teams, and her own jobs without a team (not other people's).
    teams = client_for(scenario.alice).get(URL, {**q, "by": "team"}).json()["rows"]
    assert [r["name"] for r in teams] == ["vision", NO_TEAM]
    start, end = scenario.window
    want = expected(scenario.ledger, start=start, end=end, now=timezone.now(), by="team")
    assert_rows_equal(teams, {"vision": want["vision"], NO_TEAM: want[NO_TEAM]})
    # bob has no teamless job: the vision row only (alice's usage in it included).
    assert [r["name"] for r in client_for(scenario.bob).get(URL, {**q, "by": "team"}).json()["rows"]] == [
        "vision"
    ]
    carol = client_for(scenario.carol).get(URL, q).json()["rows"]
    assert [r["name"] for r in carol] == ["carol"]


def test_a_user_without_jobs_gets_no_rows(scenario):
    assert client_for(UserFactory()).get(URL, {"window": "365d", "by": "team"}).json()["rows"] == []


def test_anonymous_is_401():
    answer = APIClient().get(URL)
    assert answer.status_code == 401 and answer["WWW-Authenticate"] == "Token"
    answer = APIClient().get(URL, {"format": "csv"})
    assert answer.status_code == 401 and answer["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"window": "2d"}, "window"),
        ({"window": ""}, "window"),
        ({"by": "group"}, "by"),
        ({"by": ""}, "by"),
        ({"start": ""}, "start"),
        ({"format": ""}, "format"),
        ({"start": "yesterday"}, "start"),
        ({"start": "2026-13-01T00:00:00Z"}, "start"),
        ({"start": "2026-01-01T00:00:00Z", "end": "soon"}, "end"),
        ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end"),
        ({"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end"),
        ({"start": "2024-01-01T00:00:00Z", "end": "2025-02-05T00:00:01Z"}, "start"),
        ({"start": "2000-01-01T00:00:00Z"}, "start"),
        ({"window": "7d", "start": "2026-01-01T00:00:00Z"}, "window"),
        ({"end": "2026-01-01T00:00:00Z"}, "start"),
        ({"format": "xml"}, "format"),
        ({"format": "csv", "window": "1y"}, "window"),
    ],
)
def test_a_bad_parameter_is_a_400_naming_it(user, query, field):
    answer = client_for(user).get(URL, query)
    assert answer.status_code == 400, answer.content
    assert answer["Content-Type"] == "application/json"
    assert list(answer.json()) == [field]


def test_400_days_is_the_longest_window(user):
    query = {"start": "2024-01-01T00:00:00Z", "end": "2025-02-04T00:00:00Z"}
    assert client_for(user).get(URL, query).status_code == 200


def parse_csv(answer) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(answer.content.decode())))


@pytest.mark.parametrize("how", ["format", "accept"])
def test_csv_has_one_row_per_name_and_one_column_per_end_state(scenario, staff_user, how):
    query = window_query(scenario)
    client = client_for(staff_user)
    if how == "format":
        answer = client.get(URL, {**query, "format": "csv"})
    else:
        answer = client.get(URL, query, HTTP_ACCEPT="text/csv")
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/csv; charset=utf-8"
    assert answer["Content-Disposition"].startswith('attachment; filename="accounting-user-')
    header = answer.content.decode().splitlines()[0].split(",")
    assert header == ["name", "gpu_hours", "cpu_core_hours", "mem_gb_hours", *END_STATES, "jobs_total",
                      "mean_wait_s", "p95_wait_s"]  # fmt: skip
    rows = client.get(URL, query).json()["rows"]
    table = parse_csv(answer)
    assert [r["name"] for r in table] == [r["name"] for r in rows]
    for line, row in zip(table, rows, strict=True):
        assert float(line["gpu_hours"]) == pytest.approx(row["gpu_hours"])
        assert float(line["mem_gb_hours"]) == pytest.approx(row["mem_gb_hours"])
        assert {s: int(line[s]) for s in END_STATES} == row["jobs"]
        assert line["p95_wait_s"] == ("" if row["p95_wait_s"] is None else line["p95_wait_s"])
    carol = next(line for line in table if line["name"] == "carol")
    assert carol["mean_wait_s"] == "" and carol["CANCELLED"] == "1"


def test_csv_keeps_a_name_that_looks_like_a_formula_as_text(staff_user):
    now = timezone.now()
    JobFactory(owner=UserFactory(username="=cmd"), state=JobState.COMPLETED, finished_at=now - H)
    table = parse_csv(client_for(staff_user).get(URL, {"window": "24h", "format": "csv"}))
    assert [r["name"] for r in table] == ["'=cmd"]


def test_the_schema_documents_the_parameters_json_and_csv(staff_user):
    schema = client_for(staff_user).get("/api/schema/?format=json").json()
    operation = schema["paths"][URL]["get"]
    params = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert params["window"]["enum"] == ["1h", "6h", "24h", "7d", "30d", "365d"]
    assert params["by"]["enum"] == ["user", "team"] and params["format"]["enum"] == ["json", "csv"]
    assert params["start"]["format"] == params["end"]["format"] == "date-time"
    content = operation["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/csv"}
    assert "400" in operation["responses"] and "401" in operation["responses"]
