"""LDAP and OpenID Connect sign-in end to end in chromium, against the real slapd and provider processes:
a wrong password is refused, the right one signs in, the user's group puts them in its team, and the token
page gives a token that the API and the CLI's `login` accept."""

from __future__ import annotations

import re

import httpx
import pytest

from cli import commands
from cli.api import Api, CliError
from cli.config import resolve

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def teams_of(username: str) -> list[str]:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username=username)
    return sorted(user.attune_teams.values_list("name", flat=True))


def token_from_the_page(page, live_server) -> str:
    """Open the token page from the header, make a token, read it."""
    page.get_by_role("link", name="API token").click()
    page.wait_for_url(f"{live_server.url}/account/token/")
    page.get_by_role("button", name="Make a token").click()
    page.get_by_text("Token made.").wait_for()
    page.get_by_text(f"attune --server {live_server.url} login").wait_for()
    return page.get_by_label("Token").input_value()


def assert_token_works(live_server, token: str, token_file) -> None:
    """The API takes the token; the CLI's `login --token` checks and saves it; later commands use it."""
    answer = httpx.get(f"{live_server.url}/api/v1/jobs/", headers={"Authorization": f"Token {token}"})
    assert answer.status_code == 200, answer.text
    with pytest.raises(CliError, match="not saved"):
        commands.login(Api(live_server.url, None), username=None, token=token[:-1] + "x", out=_Sink())
    assert not token_file.exists()
    out = _Sink()
    assert commands.login(Api(live_server.url, None), username=None, token=token, out=out) == 0
    saved = resolve(server=None, token=None)
    assert (saved.server, saved.token) == (live_server.url, token)
    assert Api(saved.server, saved.token).jobs({}) == []


class _Sink:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text


def test_ldap_sign_in_in_the_browser(browser_page, live_server, ldap_on, token_file):
    page = browser_page
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_text("Your lab account's username and password work here.").wait_for()

    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("wrong-password")
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("alert").filter(has_text="correct username and password").wait_for()
    assert page.url.startswith(f"{live_server.url}/accounts/login/")

    page.get_by_label("Password").fill("alice-ldap-pw")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/jobs/")
    assert page.locator(".username").inner_text() == "alice"
    assert teams_of("alice") == ["vision"]

    token = token_from_the_page(page, live_server)
    assert_token_works(live_server, token, token_file)

    page.get_by_role("button", name="Make a new token").click()
    page.get_by_text("New token made: the old one no longer works.").wait_for()
    new_token = page.get_by_label("Token").input_value()
    assert new_token != token
    old = httpx.get(f"{live_server.url}/api/v1/jobs/", headers={"Authorization": f"Token {token}"})
    new = httpx.get(f"{live_server.url}/api/v1/jobs/", headers={"Authorization": f"Token {new_token}"})
    assert (old.status_code, new.status_code) == (401, 200)
    assert page.console_errors == []


def sign_in_at_the_provider(page, live_server, oidc, username: str, password: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_role("link", name="Sign in with the lab's identity provider").click()
    page.wait_for_url(re.compile(rf"^{re.escape(oidc.issuer)}/interaction/"))
    page.get_by_label("Provider username").fill(username)
    page.get_by_label("Provider password").fill(password)
    page.get_by_role("button", name="Sign in to the provider").click()


def test_oidc_sign_in_in_the_browser(browser_page, live_server, oidc_on, token_file):
    page = browser_page
    sign_in_at_the_provider(page, live_server, oidc_on, "carol", "not-carols")
    page.get_by_role("alert").filter(has_text="Wrong username or password.").wait_for()
    assert page.url.startswith(f"{oidc_on.issuer}/interaction/")  # refused: still at the provider

    page.get_by_label("Provider username").fill("carol")
    page.get_by_label("Provider password").fill("carol-idp-pw")
    page.get_by_role("button", name="Sign in to the provider").click()
    page.wait_for_url(f"{live_server.url}/jobs/")
    assert page.locator(".username").inner_text() == "carol"
    assert teams_of("carol") == ["vision"]

    assert_token_works(live_server, token_from_the_page(page, live_server), token_file)


def test_oidc_groups_with_paths_give_team_and_staff(browser_page, live_server, oidc_on):
    from django.contrib.auth import get_user_model

    sign_in_at_the_provider(browser_page, live_server, oidc_on, "dave", "dave-idp-pw")
    browser_page.wait_for_url(f"{live_server.url}/jobs/")
    dave = get_user_model().objects.get(username="dave")
    assert teams_of("dave") == ["nlp"]  # Keycloak-style "/nlp-lab"
    assert dave.is_staff and dave.email == "dave@lab.example"
    browser_page.get_by_role("link", name="Admin").wait_for()


def test_oidc_user_outside_the_required_group_is_refused(
    browser_page, live_server, oidc_on, apply_sign_in_env
):
    apply_sign_in_env({**oidc_on.environment(), "ATTUNE_OIDC_REQUIRE_GROUP": "gpu-users"})
    sign_in_at_the_provider(browser_page, live_server, oidc_on, "carol", "carol-idp-pw")
    browser_page.wait_for_url(re.compile(r"/accounts/login/\?sso=failed"))
    browser_page.get_by_role("alert").filter(has_text="did not succeed").wait_for()
    from django.contrib.auth import get_user_model

    assert not get_user_model().objects.filter(username="carol").exists()
