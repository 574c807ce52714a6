"""The glossary page: every term the site shows, each with its one line (public, like the home page)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from scheduler_app.glossary import SECTIONS


@require_GET
def glossary(request: HttpRequest) -> HttpResponse:
    return render(request, "web/glossary.html", {"sections": SECTIONS})
