"""The /metrics endpoint: a plain Django view (not DRF, so it stays out of the API schema)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client.exposition import choose_encoder

from scheduler_app.metrics.access import Verdict, metrics_request_verdict
from scheduler_app.metrics.collector import metrics_registry

PLAIN = "text/plain; charset=utf-8"


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Every attune_* metric in the format the scraper asks for (Prometheus text, or OpenMetrics)."""
    verdict = metrics_request_verdict(request)
    if verdict is Verdict.UNAUTHENTICATED:
        response = HttpResponse(
            "401 Unauthorized: send Authorization: Bearer <token>\n", status=401, content_type=PLAIN
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if verdict is Verdict.FORBIDDEN:
        return HttpResponse(
            "403 Forbidden: this address may not scrape /metrics\n", status=403, content_type=PLAIN
        )
    # The same negotiation as prometheus_client's own WSGI app: OpenMetrics when the scraper asks.
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    response = HttpResponse(encoder(metrics_registry()), content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
