"""Routes of the user pages, mounted at the site root by config/urls.py."""

from django.contrib.auth import views as auth_views
from django.urls import path

from scheduler_app.web import accounting_views, glossary_views, views

app_name = "web"

urlpatterns = [
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("jobs/", views.queue, name="queue"),
    path("jobs/new/", views.job_submit, name="submit"),
    path("jobs/<int:pk>/", views.job_detail, name="job"),
    path("jobs/<int:pk>/cancel/", views.job_cancel_view, name="job-cancel"),
    path("jobs/<int:pk>/hold/", views.job_hold_view, name="job-hold"),
    path("jobs/<int:pk>/release/", views.job_release_view, name="job-release"),
    path("jobs/<int:pk>/update/", views.job_update_view, name="job-update"),
    path("cluster/", views.cluster, name="cluster"),
    path("accounting/", accounting_views.accounting, name="accounting"),
    path("cluster/servers/<str:name>/drain/", views.server_drain, name="server-drain"),
    path("cluster/servers/<str:name>/resume/", views.server_resume, name="server-resume"),
    path("glossary/", glossary_views.glossary, name="glossary"),
]
