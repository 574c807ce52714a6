"""Routes of the REST API, mounted at /api/v1/ by config/urls.py."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduler_app.api import accounting_views, agent_views, views, workload_views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("servers", views.ServerViewSet, basename="server")

urlpatterns = [
    # The agent protocol's paths have no trailing slash (docs/agent-protocol.md).
    path("agent/register", agent_views.AgentRegisterView.as_view(), name="agent-register"),
    path("agent/sync", agent_views.AgentSyncView.as_view(), name="agent-sync"),
    # agent/wait, the long-poll between syncs, is served by config/asgi.py outside Django's views.
    path("cluster/", views.ClusterView.as_view(), name="cluster"),
    path("workloads/", workload_views.WorkloadListView.as_view(), name="workload-list"),
    path("auth/token/", views.TokenView.as_view(), name="auth-token"),
    path("accounting/", accounting_views.AccountingView.as_view(), name="accounting"),
    *router.urls,
]
