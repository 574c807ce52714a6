"""Routes of the notification settings page, mounted under /account/ by config/urls.py."""

from django.urls import path

from notify_app import views

app_name = "notify"

urlpatterns = [
    path("notifications/", views.notification_settings, name="settings"),
    path("notifications/test/", views.notification_test, name="test"),
]
