"""Thin views of sign-in: the personal API token page, and the OpenID Connect routes, shut when it is off."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from scheduler_app.selectors.api_tokens import api_token_of
from scheduler_app.services.api_tokens import api_token_rotate


@never_cache  # a secret: no cache or back button keeps a copy
@login_required
def api_token(request: HttpRequest) -> HttpResponse:
    """GET: the user's token and how to give it to the CLI; POST: a new one (the old one stops working)."""
    if request.method == "POST":
        had = api_token_of(request.user) is not None
        api_token_rotate(request.user)
        messages.success(request, "New token made: the old one no longer works." if had else "Token made.")
        return redirect("sign_in:api-token")
    context = {"token": api_token_of(request.user), "server": request.build_absolute_uri("/").rstrip("/")}
    return render(request, "web/api_token.html", context)


def _oidc_on() -> None:
    if not getattr(settings, "ATTUNE_OIDC_ENABLED", False):
        raise Http404("OpenID Connect sign-in is not configured (docs/auth.md).")


def oidc_start(request: HttpRequest) -> HttpResponse:
    """Off to the provider's login form (mozilla-django-oidc's view: state, nonce, PKCE)."""
    _oidc_on()
    return OIDCAuthenticationRequestView.as_view()(request)


def oidc_callback(request: HttpRequest) -> HttpResponse:
    """Back from the provider: the code is exchanged and checked by the backend, the user signed in."""
    _oidc_on()
    return OIDCAuthenticationCallbackView.as_view()(request)
