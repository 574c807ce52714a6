"""The answer to a login that django-axes refused: a 429 saying when to retry (a page; JSON for the API)."""

from __future__ import annotations

import math

from axes.helpers import get_cool_off
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render


def lockout_wait_s(request: HttpRequest | None = None) -> int:
    """Seconds until a locked-out username and address may try again: the whole cool-off, since every
    failure during a lockout starts it anew (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT)."""
    cool_off = get_cool_off(request)
    return math.ceil(cool_off.total_seconds()) if cool_off else 0


def _in_words(seconds: int) -> str:
    if seconds >= 120:
        return f"{math.ceil(seconds / 60)} minutes"
    return f"{seconds} seconds"


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: dict | None = None
) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: a 429 with Retry-After; the API's error shape under /api/, a page elsewhere."""
    wait_s = lockout_wait_s(request)
    detail = (
        f"Too many failed logins for this username from your address: try again in {_in_words(wait_s)}."
        if wait_s
        else "Too many failed logins for this username from your address: ask an administrator to unlock it."
    )
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"detail": detail}, status=429)
    else:
        context = {"detail": detail, "failure_limit": settings.AXES_FAILURE_LIMIT}
        response = render(request, "registration/locked_out.html", context, status=429)
    if wait_s:
        response["Retry-After"] = str(wait_s)
    return response
