"""The notification settings page, its test button, and the admin."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from notify_app.models import Notification, NotificationSettings, NotificationState
from scheduler_app.models import JobState
from tests.api.helpers import make_server, submit
from tests.notify_app.helpers import opt_in

pytestmark = pytest.mark.django_db

URL = "/account/notifications/"
VALID = {
    "email_enabled": "on",
    "email": "",
    "webhook_url": "https://hooks.example.org/services/T0/B0/secret",
    "on_end": "on",
    "on_failure": "on",
}


@pytest.fixture
def client(owner) -> Client:
    c = Client()
    c.force_login(owner)
    return c


@pytest.fixture(autouse=True)
def fresh_cache():
    from django.core.cache import cache

    cache.clear()


def test_login_required():
    response = Client().get(URL)
    assert response.status_code == 302 and reverse("web:login") in response["Location"]
    assert reverse("notify:settings") == URL


def test_defaults_are_off_until_the_user_opts_in(client):
    response = client.get(URL)
    assert response.status_code == 200
    form = response.context["form"]
    assert form["email_enabled"].value() is False and form["webhook_url"].value() == ""
    assert b"No notifications yet." in response.content
    assert not NotificationSettings.objects.exists()  # showing the page saves nothing


def test_saving_the_settings(client, owner):
    response = client.post(URL, VALID)
    assert response.status_code == 302 and response["Location"] == URL
    prefs = NotificationSettings.objects.get(user=owner)
    assert prefs.email_enabled and prefs.email == "" and prefs.webhook_url == VALID["webhook_url"]
    assert (prefs.on_end, prefs.on_failure, prefs.on_qos_at_risk) == (True, True, False)
    client.post(URL, {**VALID, "email_enabled": "", "webhook_url": ""})
    prefs.refresh_from_db()
    assert not prefs.email_enabled and prefs.webhook_url == ""
    assert NotificationSettings.objects.count() == 1


@pytest.mark.parametrize(
    "url",
    ["ftp://example.org/hook", "javascript:alert(1)", "file:///etc/passwd", "gopher://x/", "not a url"],
)
def test_a_webhook_must_be_http_or_https(client, url):
    response = client.post(URL, {**VALID, "webhook_url": url})
    assert response.status_code == 200
    assert "webhook_url" in response.context["form"].errors
    assert not NotificationSettings.objects.exists()


def test_the_allowed_webhook_hosts(client, settings):
    settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "webhook_hosts": ["slack.com"]}
    response = client.post(URL, VALID)
    assert "only go to slack.com" in str(response.context["form"].errors["webhook_url"])
    ok = client.post(URL, {**VALID, "webhook_url": "https://hooks.slack.com/services/x"})
    assert ok.status_code == 302


def test_email_on_needs_an_address(client, owner):
    owner.email = ""
    owner.save()
    response = client.post(URL, VALID)
    assert "no email address" in str(response.context["form"].errors["email"])
    assert client.post(URL, {**VALID, "email": "me@example.org"}).status_code == 302


def test_recent_notifications_are_listed_with_their_state(client, owner, queued):
    make_server("gpu01")
    opt_in(owner)
    job = submit(owner, name="visible-job")
    from notify_app.services.events import notification_job_ended

    (n,) = notification_job_ended(job=job, state=JobState.FAILED)
    Notification.objects.filter(pk=n.pk).update(
        state=NotificationState.FAILED, last_error="SMTP 550: no such user"
    )
    page = client.get(URL).content.decode()
    assert f'id="notification-{n.pk}"' in page and "visible-job" in page and "SMTP 550: no such user" in page


def test_the_test_button_sends_on_each_channel(client, owner, smtp, receiver):
    opt_in(owner, webhook_url=receiver.url)
    response = client.post(reverse("notify:test"), follow=True)
    texts = [str(m) for m in response.context["messages"]]
    assert texts == ["Test email sent.", "Test webhook sent."]
    assert len(smtp.messages) == 1 and smtp.messages[0]["Subject"] == "[Attune] Test notification"
    assert receiver.requests[0].body["event"] == "test"
    # A second press moments later is refused: the button must not be a mail cannon.
    again = client.post(reverse("notify:test"), follow=True)
    assert "less than" in str(next(iter(again.context["messages"])))
    assert len(smtp.messages) == 1 and len(receiver.requests) == 1


def test_the_test_button_says_what_failed(client, owner, receiver):
    receiver.statuses = [404]
    opt_in(owner, email=False, webhook_url=receiver.url)
    response = client.post(reverse("notify:test"), follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "Test webhook not sent: webhook 127.0.0.1 answered HTTP 404"
    ]


def test_the_test_button_without_a_channel(client):
    response = client.post(reverse("notify:test"), follow=True)
    assert "No channel is on" in str(next(iter(response.context["messages"])))
    assert client.get(reverse("notify:test")).status_code == 405


def test_admin_pages(owner, staff_user, queued):
    make_server("gpu01")
    opt_in(owner, webhook_url="https://hooks.example.org/services/secret")
    from notify_app.services.events import notification_job_ended

    (email, webhook) = notification_job_ended(job=submit(owner), state=JobState.FAILED)
    Notification.objects.filter(pk=email.pk).update(state=NotificationState.FAILED, tries=3)
    c = Client()
    c.force_login(staff_user)
    settings_list = c.get(reverse("admin:notify_app_notificationsettings_changelist"))
    assert settings_list.status_code == 200
    assert b"hooks.example.org" in settings_list.content and b"/services/secret" not in settings_list.content
    assert c.get(reverse("admin:notify_app_notification_changelist")).status_code == 200
    assert c.get(reverse("admin:notify_app_notification_change", args=[email.pk])).status_code == 200
    response = c.post(
        reverse("admin:notify_app_notification_changelist"),
        {"action": "send_again", "_selected_action": [email.pk, webhook.pk]},
    )
    assert response.status_code == 302
    email.refresh_from_db()
    assert (email.state, email.tries) == (NotificationState.PENDING, 0)
