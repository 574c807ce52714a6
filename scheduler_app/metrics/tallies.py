"""Running totals for the metrics' counters, kept in Django's cache so a scrape reads only the new rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Q, Sum

from scheduler_app.models import AgentReport, SchedulingRound

ROUNDS_KEY = "attune:metrics:rounds:v1"
REPORTS_KEY = "attune:metrics:reports:v1"
# An agent's reports carry the time their request began (received_at) but become visible only when
# its transaction commits; counting up to a minute ago leaves room for that, so none is skipped.
REPORTS_SETTLE = timedelta(seconds=60)
DECISION_FIELDS = {"placed": "num_placed", "pending": "num_pending", "infeasible": "num_infeasible"}

Values = dict[str, float]


def _running_total(
    key: str,
    *,
    upto: Any,
    delta: Callable[[Any, Any], Values],
    layout: str = "",
    recount_if_behind: bool = False,
) -> Values:
    """The totals over every row up to `upto`: the cached totals up to a watermark, plus `delta(watermark,
    upto)` (watermark None: from the first row). The cache holds the new totals for the next scrape.

    Two workers scraping at once may both add the same delta to the same cached totals and store the
    same result: each answer is the exact total up to its own `upto`, never a double count. A flushed
    cache, another `layout` (the buckets changed) or, with `recount_if_behind`, a watermark beyond
    `upto` (the table was emptied or restored) mean a recount from the rows still there, which
    Prometheus reads as a counter reset.
    """
    state = cache.get(key)
    if state is not None and (state.get("layout") != layout or (recount_if_behind and upto < state["upto"])):
        state = None
    if state is not None and not upto > state["upto"]:
        return dict(state["values"])
    values: Values = dict(state["values"]) if state else {}
    for name, value in delta(state["upto"] if state else None, upto).items():
        values[name] = values.get(name, 0.0) + float(value or 0)
    cache.set(key, {"upto": upto, "layout": layout, "values": values}, timeout=None)
    return values


def round_totals(*, latest_id: int | None, buckets_s: Sequence[float]) -> Values:
    """Over every scheduling round: rounds (`count`), summed duration (`sum_s`), rounds per duration
    bucket (`le:<b>`, cumulative), and the decisions (`placed`, `pending`, `infeasible`) and
    preemptions (`preempted`) and resizes in place (`resized`) they made.

    Decisions come from the round's own counts, which equal its RoundDecision rows by outcome: those
    are pruned after ATTUNE_ROUND_DECISION_RETENTION_DAYS, the rounds stay, so the counters keep
    rising. Watermark: the highest round id. Rounds are single-flight (the advisory lock is held until
    the round commits), so ids become visible in order and none is ever skipped behind it.
    `latest_id`: the highest round id now (None: no round).
    """
    if latest_id is None:
        cache.delete(ROUNDS_KEY)
        return {}

    def delta(after: int | None, upto: int) -> Values:
        rounds = SchedulingRound.objects.filter(id__lte=upto)
        if after is not None:
            rounds = rounds.filter(id__gt=after)
        sums = rounds.aggregate(
            count=Count("id"),
            sum_ms=Sum("duration_ms"),
            preempted=Sum("num_preempted"),
            resized=Sum("num_resized"),
            **{outcome: Sum(field) for outcome, field in DECISION_FIELDS.items()},
            **{f"le:{b:g}": Count("id", filter=Q(duration_ms__lte=b * 1000.0)) for b in buckets_s},
        )
        sums["sum_s"] = (sums.pop("sum_ms") or 0.0) / 1000.0
        return sums

    # The buckets are part of the state: changing them recounts instead of mixing two layouts.
    layout = ",".join(f"{b:g}" for b in buckets_s)
    return _running_total(ROUNDS_KEY, upto=latest_id, delta=delta, layout=layout, recount_if_behind=True)


def report_totals(*, now: datetime) -> Values:
    """Agent reports ingested so far, by kind, counted up to REPORTS_SETTLE before `now`.

    Rows are pruned (ATTUNE_AGENT_REPORT_RETENTION_DAYS), so a plain row count would fall; the running
    total does not. Watermark: received_at (an id would not do: concurrent agents commit out of id
    order, and an insert that hits a duplicate still uses up an id).
    """

    def delta(after: datetime | None, upto: datetime) -> Values:
        reports = AgentReport.objects.filter(received_at__lt=upto)
        if after is not None:
            reports = reports.filter(received_at__gte=after)
        return dict(reports.order_by().values_list("kind").annotate(n=Count("id")).values_list("kind", "n"))

    return _running_total(REPORTS_KEY, upto=now - REPORTS_SETTLE, delta=delta)


def tallies_forget() -> None:
    """Drop every cached total (tests: each starts with an empty database but the same cache)."""
    cache.delete_many([ROUNDS_KEY, REPORTS_KEY])
