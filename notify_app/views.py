"""Thin views of the notification settings page: validate, call one service or selector, render."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from notify_app.forms import NotificationSettingsForm
from notify_app.selectors import notification_list, notification_settings_of
from notify_app.services.settings import (
    NotificationTestThrottledError,
    notification_settings_save,
    notification_test_send,
)


@login_required
def notification_settings(request: HttpRequest) -> HttpResponse:
    """The user's channels and events, and their recent notifications with how each went."""
    prefs = notification_settings_of(user=request.user)
    form = NotificationSettingsForm(request.POST or None, instance=prefs)
    if request.method == "POST" and form.is_valid():
        try:
            notification_settings_save(user=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            messages.success(request, "Notification settings saved.")
            return redirect("notify:settings")
    context = {
        "form": form,
        "account_email": request.user.email,
        "notifications": notification_list(user=request.user),
    }
    return render(request, "notify_app/settings.html", context)


@require_POST
@login_required
def notification_test(request: HttpRequest) -> HttpResponse:
    """Send a test notification on each saved channel now, and say how each went."""
    try:
        results = notification_test_send(user=request.user)
    except NotificationTestThrottledError as exc:
        messages.error(request, str(exc))
        return redirect("notify:settings")
    if not results:
        messages.error(request, "No channel is on: turn on emails or give a webhook URL, and save, first.")
    for channel, outcome in results:
        if outcome == "sent":
            messages.success(request, f"Test {channel} sent.")
        else:
            messages.error(request, f"Test {channel} not sent: {outcome}")
    return redirect("notify:settings")
