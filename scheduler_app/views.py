"""Thin web views: the home page and a health check."""

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from cluster_app.selectors import cluster_capacity, server_list
from scheduler_app.selectors import job_counts_by_state


def home(request: HttpRequest) -> HttpResponse:
    context = {
        "capacity": cluster_capacity(),
        "servers": server_list(),
        "job_counts": job_counts_by_state(),
    }
    return render(request, "scheduler_app/home.html", context)


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and compose health checks: answers only if the database does."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok", "database": connection.vendor})
