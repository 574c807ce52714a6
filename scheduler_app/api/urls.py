"""Routes of the REST API, mounted at /api/v1/ by config/urls.py."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduler_app.api import agent_views, views

router = SimpleRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("servers", views.ServerViewSet, basename="server")

urlpatterns = [
    # The agent protocol's paths have no trailing slash (docs/agent-protocol.md).
    path("agent/register", agent_views.AgentRegisterView.as_view(), name="agent-register"),
    path("agent/heartbeat", agent_views.AgentHeartbeatView.as_view(), name="agent-heartbeat"),
    path("agent/poll", agent_views.AgentPollView.as_view(), name="agent-poll"),
    path("agent/reports", agent_views.AgentReportsView.as_view(), name="agent-reports"),
    path("cluster/", views.ClusterView.as_view(), name="cluster"),
    path("auth/token/", views.TokenView.as_view(), name="auth-token"),
    *router.urls,
]
