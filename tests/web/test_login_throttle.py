"""Failed logins are throttled (django-axes): on the login form and on the API's token endpoint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

FORM = "/accounts/login/"
TOKEN = "/api/v1/auth/token/"
RIGHT = "pw-for-tests"  # tests.factories.UserFactory's password


@pytest.fixture(autouse=True)
def throttle(settings):
    """Three failures lock out for ten minutes (the defaults are five and fifteen)."""
    settings.AXES_ENABLED = True
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_COOLOFF_TIME = timedelta(minutes=10)
    return settings


def form_login(client: Client, username: str, password: str):
    return client.post(FORM, {"username": username, "password": password})


def token_login(client: APIClient, username: str, password: str):
    return client.post(TOKEN, {"username": username, "password": password}, format="json")


def cool_off_passes() -> None:
    """Date every recorded failure back past the cool-off (instead of waiting ten minutes)."""
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=11))


def test_the_form_refuses_the_right_password_after_too_many_wrong_ones_until_the_cool_off(user):
    client = Client()
    for _ in range(2):
        assert form_login(client, user.username, "wrong").status_code == 200  # the form again, with its error
    assert form_login(client, user.username, "wrong").status_code == 429  # the third locks out
    locked = form_login(client, user.username, RIGHT)
    assert locked.status_code == 429
    assert locked["Retry-After"] == "600"
    assert b"try again in 10 minutes" in locked.content
    assert "_auth_user_id" not in client.session
    cool_off_passes()
    response = form_login(client, user.username, RIGHT)
    assert response.status_code == 302 and response["Location"] == "/jobs/"


def test_the_token_endpoint_refuses_the_right_password_after_too_many_wrong_ones_until_the_cool_off(user):
    client = APIClient()
    for _ in range(2):
        assert token_login(client, user.username, "wrong").status_code == 400
    assert token_login(client, user.username, "wrong").status_code == 429
    locked = token_login(client, user.username, RIGHT)
    assert locked.status_code == 429
    assert locked["Retry-After"] == "600"
    assert locked.json() == {
        "detail": "Too many failed logins for this username from your address: try again in 10 minutes."
    }
    cool_off_passes()
    response = token_login(client, user.username, RIGHT)
    assert response.status_code == 200 and response.json()["token"]


def test_failures_count_across_the_form_and_the_token_endpoint(user):
    for _ in range(2):
        token_login(APIClient(), user.username, "wrong")
    form_login(Client(), user.username, "wrong")
    assert token_login(APIClient(), user.username, RIGHT).status_code == 429


def test_a_lockout_holds_one_username_from_one_address_only(user, staff_user):
    for _ in range(3):
        form_login(Client(REMOTE_ADDR="203.0.113.7"), user.username, "wrong")
    assert form_login(Client(REMOTE_ADDR="203.0.113.7"), user.username, RIGHT).status_code == 429
    assert form_login(Client(REMOTE_ADDR="198.51.100.8"), user.username, RIGHT).status_code == 302
    assert form_login(Client(REMOTE_ADDR="203.0.113.7"), staff_user.username, RIGHT).status_code == 302


def test_a_successful_login_clears_the_count(user):
    client = APIClient()
    for _ in range(2):
        token_login(client, user.username, "wrong")
    assert token_login(client, user.username, RIGHT).status_code == 200
    for _ in range(2):
        token_login(client, user.username, "wrong")
    assert token_login(client, user.username, RIGHT).status_code == 200


def test_turned_off_nothing_is_locked(user, settings):
    settings.AXES_ENABLED = False
    client = APIClient()
    for _ in range(5):
        token_login(client, user.username, "wrong")
    assert token_login(client, user.username, RIGHT).status_code == 200
