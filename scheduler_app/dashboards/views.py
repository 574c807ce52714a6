"""Thin dashboard views: staff only; pages render a shell, charts fetch their JSON and redraw."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from scheduler_app.dashboards import prediction_accuracy, restarts, selectors, whatif_selectors
from scheduler_app.dashboards.buckets import DEFAULT_WINDOW, window_from_query, window_options, window_span_s
from scheduler_app.dashboards.forms import WhatIfForm
from scheduler_app.dashboards.services import whatif_run_create, whatif_run_dispatch
from scheduler_app.models import SimulationRun
from scheduler_app.web.access import staff_required

REFRESH_S = 30


def _page_window(request: HttpRequest) -> str:
    """The window in the page's URL (`?window=6h`), kept by a reload or a shared link; else the default."""
    window = request.GET.get("window", DEFAULT_WINDOW).strip()
    try:
        window_span_s(window)
    except ValueError:
        return DEFAULT_WINDOW  # a mistyped link still shows the dashboard
    return window


def _page(request: HttpRequest, template: str, **context: Any) -> HttpResponse:
    window = _page_window(request)
    return render(
        request,
        f"dashboards/{template}",
        {
            "window": window,
            "window_options": window_options(window),
            # Appended to the links between dashboards, so that following one keeps the window.
            "window_query": "" if window == DEFAULT_WINDOW else "?" + urlencode({"window": window}),
            "default_window": DEFAULT_WINDOW,
            "refresh_s": REFRESH_S,
            **context,
        },
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
    """A JSON endpoint over `?window=6h` (or `?days=N`; default 24h): `build(window=...)` as JSON."""

    @staff_required
    @require_GET
    def endpoint(request: HttpRequest) -> HttpResponse:
        try:
            window = window_from_query(request.GET, now=timezone.now())
        except ValueError as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        return JsonResponse(build(window=window))

    return endpoint


utilisation_json = _series_endpoint(selectors.utilisation_series)
jct_json = _series_endpoint(selectors.jct_series)
qos_json = _series_endpoint(selectors.qos_series)
queue_json = _series_endpoint(selectors.queue_series)
admission_json = _series_endpoint(selectors.admission_accuracy_series)
prediction_json = _series_endpoint(prediction_accuracy.prediction_accuracy_series)
restarts_json = _series_endpoint(restarts.restart_loss_series)


@staff_required
@require_http_methods(["GET", "POST"])
def whatif(request: HttpRequest) -> HttpResponse:
    form = WhatIfForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        run = whatif_run_create(request=form.request, history=form.history, created_by=request.user)
        whatif_run_dispatch(run=run)
        return redirect("dashboards:whatif_run", run_id=run.pk)
    return _page(request, "whatif.html", form=form, runs=whatif_selectors.simulation_runs_recent())


@staff_required
@require_GET
def whatif_run(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(SimulationRun, pk=run_id)
    return _page(request, "whatif_run.html", run=run, summary=whatif_selectors.simulation_run_view(run))


@staff_required
@require_GET
def whatif_run_json(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(SimulationRun, pk=run_id)
    return JsonResponse(whatif_selectors.simulation_run_view(run))
