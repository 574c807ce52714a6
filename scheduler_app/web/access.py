"""Access rules shared by the user pages and the dashboards."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.views.defaults import permission_denied


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Anonymous users go to the login page; signed-in users who are not staff get 403 (no login loop)."""

    @wraps(view)
    @login_required
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            # Answered here, not raised: Django logs a raised PermissionDenied with its traceback, and a
            # refused page is routine (one "Forbidden" line), not an error.
            return permission_denied(request, PermissionDenied("staff only"))
        return view(request, *args, **kwargs)

    return wrapped
