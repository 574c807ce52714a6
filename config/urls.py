"""Top-level URL routes: home page, admin, health check."""

from django.contrib import admin
from django.urls import path

from scheduler_app import views as scheduler_views

urlpatterns = [
    path("", scheduler_views.home, name="home"),
    path("healthz", scheduler_views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
]
