"""The accounting page (sreport in a page): usage per user or team over a chosen window, CSV download."""

from __future__ import annotations

from dataclasses import dataclass

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from scheduler_app.selectors import (
    ACCOUNTING_WINDOWS,
    DEFAULT_ACCOUNTING_WINDOW,
    END_STATES,
    AccountingRow,
    accounting_report,
    accounting_window,
)

BY_CHOICES = (("user", "By user"), ("team", "By team"))


class AccountingForm(forms.Form):
    """The page's query: a named window up to now and the grouping; both optional (defaults)."""

    window = forms.ChoiceField(choices=[(w, w) for w in ACCOUNTING_WINDOWS], required=False, label="Window")
    by = forms.ChoiceField(choices=BY_CHOICES, required=False, label="Group")


@dataclass(frozen=True)
class ShownRow:
    """An accounting row with its jobs in END_STATES order and its waits in readable units."""

    row: AccountingRow
    jobs: list[int]
    mean_wait: str
    p95_wait: str


def readable_duration(seconds: float | None) -> str:
    """Seconds as a person reads them: "45 s", "4 min", "2.5 h", "3.2 d"; "-" for none."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@login_required
def accounting(request: HttpRequest) -> HttpResponse:
    """GPU-, core- and GB-hours, jobs by end state and waits per user or team; users see their own."""
    form = AccountingForm(request.GET)
    if not form.is_valid():
        return render(request, "web/accounting.html", {"form": form, "rows": None}, status=400)
    window = form.cleaned_data["window"] or DEFAULT_ACCOUNTING_WINDOW
    by = form.cleaned_data["by"] or "user"
    start, end = accounting_window(window, now=timezone.now())
    report = accounting_report(start=start, end=end, by=by, user=request.user)
    rows = [
        ShownRow(
            row=row,
            jobs=[row.jobs[state] for state in END_STATES],
            mean_wait=readable_duration(row.mean_wait_s),
            p95_wait=readable_duration(row.p95_wait_s),
        )
        for row in report.rows
    ]
    context = {
        "form": form,
        "report": report,
        "rows": rows,
        "window": window,
        "by": by,
        "windows": [(w, urlencode({"window": w, "by": by})) for w in ACCOUNTING_WINDOWS],
        "groupings": [(b, label, urlencode({"window": window, "by": b})) for b, label in BY_CHOICES],
        "end_states": END_STATES,
        "restart_loss": report.restart_loss_by_day,
        "restart_loss_total": sum(day.gpu_hours for day in report.restart_loss_by_day),
        "csv_url": f"{reverse('accounting')}?{urlencode({'window': window, 'by': by, 'format': 'csv'})}",
    }
    return render(request, "web/accounting.html", context)
