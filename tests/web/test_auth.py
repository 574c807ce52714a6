"""Login, logout and who may open which page."""

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

PAGES = ["/jobs/", "/jobs/new/", "/cluster/"]


@pytest.mark.parametrize("url", PAGES)
def test_pages_send_anonymous_users_to_the_login_page(url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={url}"


def test_a_user_logs_in_and_lands_on_the_queue(user):
    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b'<label for="id_username"' in page.content and b'<label for="id_password"' in page.content
    response = client.post("/accounts/login/", {"username": user.username, "password": "pw-for-tests"})
    assert response.status_code == 302 and response["Location"] == "/jobs/"
    assert client.get("/jobs/").status_code == 200


def test_a_wrong_password_is_refused_and_the_username_kept(user):
    response = Client().post("/accounts/login/", {"username": user.username, "password": "nope"})
    assert response.status_code == 200
    assert b"correct username and password" in response.content
    assert f'value="{user.username}"'.encode() in response.content


def test_logout_is_a_post_and_ends_the_session(user, client_of):
    client = client_of(user)
    page = client.get("/jobs/")
    assert b'action="/accounts/logout/"' in page.content
    response = client.post("/accounts/logout/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert client.get("/jobs/").status_code == 302


def test_the_navigation_shows_staff_links_to_staff_only(user, staff_user, client_of):
    plain = client_of(user).get("/jobs/").content.decode()
    staff = client_of(staff_user).get("/jobs/").content.decode()
    for link in ('href="/jobs/"', 'href="/jobs/new/"', 'href="/cluster/"'):
        assert link in plain and link in staff
    assert 'href="/admin/"' in staff and 'href="/admin/"' not in plain


def test_the_page_serves_its_stylesheet_locally(user, client_of):
    page = client_of(user).get("/jobs/").content.decode()
    assert 'href="/static/attune/attune.css"' in page
    assert "http://" not in page.split("<body>")[0] and "https://" not in page.split("<body>")[0]
    assert client_of(user).get("/static/attune/attune.css").status_code == 200
