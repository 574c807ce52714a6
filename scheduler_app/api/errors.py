"""Django's 404 and 500 handlers, aware of the API: a path under /api/ gets JSON, as its schema says.

A URL the API's routes do not match at all (/api/v1/jobs/0.5/, /api/v1/nope) never reaches DRF, so
without this Django answers with its HTML page; an API client (and the schema's ErrorDetail) expects
`{"detail": ...}`. Everything else keeps the site's own pages.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

API_PREFIX = "/api/"


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"detail": "Server error; it has been logged."}, status=500)
    return defaults.server_error(request)
