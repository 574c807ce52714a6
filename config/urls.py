"""Top-level URL routes: home page, user pages, admin, health check, metrics, the REST API and its docs."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from scheduler_app import views as scheduler_views
from scheduler_app.metrics.views import metrics
from scheduler_app.web import sign_in_urls

urlpatterns = [
    path("", scheduler_views.home, name="home"),
    path("healthz", scheduler_views.healthz, name="healthz"),
    # Before the pages: the agents' syncs and the API's calls are most of the requests, and each route
    # tried before a match costs a regular expression (no page's route begins with api/).
    path("api/v1/", include("scheduler_app.api.urls")),
    # Prometheus's conventional path, outside /api/v1/ (docs/metrics.md).
    path("metrics", metrics, name="metrics"),
    path("", include("scheduler_app.web.urls")),
    path("dashboards/", include("scheduler_app.dashboards.urls")),
    path("account/", include("notify_app.urls")),
    # The personal API token page; OpenID Connect's routes answer 404 unless it is configured (docs/auth.md).
    path("", include("scheduler_app.web.sign_in_urls")),
    path("oidc/", include(sign_in_urls.oidc_urlpatterns)),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file of its own (?script), not inline: the
    # Content-Security-Policy allows scripts from this site only.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
]

# JSON for paths under /api/ that match no route (or fail), the site's pages elsewhere.
handler404 = "scheduler_app.api.errors.not_found"
handler500 = "scheduler_app.api.errors.server_error"
