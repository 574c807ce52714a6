"""403, 404 and 500 in the site's layout with DEBUG off; JSON under /api/ as before."""

from __future__ import annotations

import pytest
from django.template import loader
from django.test import Client, RequestFactory
from django.urls import include, path
from django.views import defaults

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def boom(request):
    raise RuntimeError("a bug, for the 500 page")


# This module is the URLconf of the 500 tests: the site's routes, a view that fails, the site's handlers.
urlpatterns = [path("boom/", boom), path("", include("config.urls"))]
handler404 = "scheduler_app.api.errors.not_found"
handler500 = "scheduler_app.api.errors.server_error"


def in_layout(html: str) -> bool:
    return 'class="topbar"' in html and 'href="/glossary/">Glossary</a></footer>' in html


@pytest.fixture(autouse=True)
def production(settings):
    settings.DEBUG = False  # Django's technical pages otherwise


def test_a_missing_page_is_a_friendly_404_for_anyone(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert in_layout(html) and "Page not found" in html and "<code>/no-such-page/</code>" in html
    assert 'href="/accounts/login/?next=/no-such-page/"' in html  # anonymous: the usual Log in link


def test_a_job_the_user_cannot_open_is_a_friendly_404(client_of):
    user = UserFactory()
    response = client_of(user).get("/jobs/999999/")
    assert response.status_code == 404
    html = response.content.decode()
    assert in_layout(html) and "Page not found" in html
    assert f'<span class="username">{user.username}</span>' in html  # the request's context is there


def test_a_page_the_user_may_not_open_is_a_friendly_403(client_of):
    response = client_of(UserFactory()).get("/dashboards/")
    assert response.status_code == 403
    html = response.content.decode()
    assert in_layout(html) and "Not allowed" in html and "staff only" in html


@pytest.mark.urls(__name__)
def test_a_server_error_is_a_friendly_500():
    response = Client(raise_request_exception=False).get("/boom/")
    assert response.status_code == 500
    html = response.content.decode()
    assert in_layout(html) and "Something went wrong on our side" in html
    assert "Log in" not in html and "a bug" not in html  # no request context; nothing of the error


def test_the_500_page_renders_without_any_context():
    """Django's server_error renders 500.html with an empty context: base.html must not need one."""
    html = loader.get_template("500.html").render()
    assert in_layout(html) and "Something went wrong on our side" in html
    response = defaults.server_error(RequestFactory().get("/"))
    assert response.status_code == 500 and in_layout(response.content.decode())


@pytest.mark.urls(__name__)
def test_api_paths_still_answer_json():
    client = Client(raise_request_exception=False)
    assert client.get("/api/v1/no-such-thing").json() == {"detail": "Not found."}
