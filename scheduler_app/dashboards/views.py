"""Thin dashboard views: staff only; pages render a shell, charts fetch their JSON and redraw."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from scheduler_app.dashboards import selectors
from scheduler_app.dashboards.buckets import MAX_DAYS, Window, window_for
from scheduler_app.dashboards.forms import WhatIfForm
from scheduler_app.dashboards.services import whatif_run_create, whatif_run_dispatch
from scheduler_app.models import SimulationRun
from scheduler_app.web.access import staff_required

DAY_CHOICES = (1, 7, 30, 90)
DEFAULT_DAYS = 7
REFRESH_S = 30


def _page(request: HttpRequest, template: str, **context: Any) -> HttpResponse:
    return render(
        request,
        f"dashboards/{template}",
        {"day_choices": DAY_CHOICES, "default_days": DEFAULT_DAYS, "refresh_s": REFRESH_S, **context},
    )


def _page_view(template: str) -> Callable[[HttpRequest], HttpResponse]:
    """A staff-only dashboard page: a shell whose charts fetch their own JSON."""

    @staff_required
    @require_GET
    def page(request: HttpRequest) -> HttpResponse:
        return _page(request, template)

    return page


index = _page_view("index.html")
utilisation = _page_view("utilisation.html")
jobs = _page_view("jobs.html")
qos = _page_view("qos.html")
queue = _page_view("queue.html")


def _series_endpoint(build: Callable[..., dict[str, Any]]) -> Callable[[HttpRequest], HttpResponse]:
    """A JSON endpoint over `?days=N` (0 < N <= MAX_DAYS, default 7): `build(window=...)` as JSON."""

    @staff_required
    @require_GET
    def endpoint(request: HttpRequest) -> HttpResponse:
        try:
            days = float(request.GET.get("days", DEFAULT_DAYS))
        except ValueError:
            days = -1.0
        if not 0 < days <= MAX_DAYS:
            return JsonResponse({"error": f"days must be a number in (0, {MAX_DAYS}]"}, status=400)
        window: Window = window_for(days=days, now=timezone.now())
        return JsonResponse(build(window=window))

    return endpoint


utilisation_json = _series_endpoint(selectors.utilisation_series)
jct_json = _series_endpoint(selectors.jct_series)
qos_json = _series_endpoint(selectors.qos_series)
queue_json = _series_endpoint(selectors.queue_series)
admission_json = _series_endpoint(selectors.admission_accuracy_series)


@staff_required
@require_http_methods(["GET", "POST"])
def whatif(request: HttpRequest) -> HttpResponse:
    form = WhatIfForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        run = whatif_run_create(request=form.request, history=form.history, created_by=request.user)
        whatif_run_dispatch(run=run)
        return redirect("dashboards:whatif_run", run_id=run.pk)
    return _page(request, "whatif.html", form=form, runs=selectors.simulation_runs_recent())


@staff_required
@require_GET
def whatif_run(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(SimulationRun, pk=run_id)
    return _page(request, "whatif_run.html", run=run, summary=selectors.simulation_run_view(run))


@staff_required
@require_GET
def whatif_run_json(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(SimulationRun, pk=run_id)
    return JsonResponse(selectors.simulation_run_view(run))
