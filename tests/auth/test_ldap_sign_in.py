"""LDAP sign-in against a real slapd: the right password signs in, a wrong one is refused, groups map to
teams and staff at every sign-in, the Unix account is the uid, local passwords still work."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.test import RequestFactory

from scheduler_app.models import UnixAccount
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def sign_in(username: str, password: str):
    request = RequestFactory().post("/accounts/login/", {"username": username, "password": password})
    return authenticate(request, username=username, password=password)


def teams_of(user) -> list[str]:
    return sorted(user.attune_teams.values_list("name", flat=True))


def test_right_password_signs_in_and_fills_the_user_from_the_directory(ldap_on):
    user = sign_in("alice", "alice-ldap-pw")
    assert user is not None and user.username == "alice"
    assert (user.first_name, user.last_name, user.email) == ("Alice", "Liddell", "alice@lab.example")
    assert not user.has_usable_password()  # the directory keeps the password, not Attune
    assert teams_of(user) == ["vision"]
    assert not user.is_staff
    assert not UnixAccount.objects.filter(user=user).exists()  # jobs run as "alice", the uid


def test_wrong_password_and_unknown_user_are_refused(ldap_on):
    assert sign_in("alice", "not-her-password") is None
    assert sign_in("mallory", "anything") is None
    assert not get_user_model().objects.filter(username__in=["alice", "mallory"]).exists()


def test_staff_group_and_group_changes_apply_at_the_next_sign_in(ldap_on):
    bob = sign_in("bob", "bob-ldap-pw")
    assert teams_of(bob) == ["nlp"] and bob.is_staff
    ldap_on.set_members("vision-lab", ["alice", "bob"])
    ldap_on.set_members("nlp-lab", ["alice"])
    try:
        bob = sign_in("bob", "bob-ldap-pw")
        assert teams_of(bob) == ["vision"]
    finally:
        ldap_on.set_members("vision-lab", ["alice"])
        ldap_on.set_members("nlp-lab", ["bob"])


def test_local_passwords_still_work_beside_ldap(ldap_on):
    UserFactory(username="localadmin", is_staff=True)
    user = sign_in("localadmin", "pw-for-tests")
    assert user is not None and user.username == "localadmin"
    assert sign_in("localadmin", "wrong") is None


def test_ldap_off_means_directory_users_cannot_sign_in(slapd, apply_sign_in_env):
    apply_sign_in_env({})
    assert sign_in("alice", "alice-ldap-pw") is None


def test_the_api_token_endpoint_takes_no_directory_password(ldap_on, client):
    """The CLI's `login --username` is for local accounts: an LDAP password never goes through the CLI."""
    refused = client.post(
        "/api/v1/auth/token/",
        {"username": "alice", "password": "alice-ldap-pw"},
        content_type="application/json",
    )
    assert refused.status_code == 400
    assert sign_in("alice", "alice-ldap-pw") is not None  # the same password works on the web's form
    UserFactory(username="local")
    taken = client.post(
        "/api/v1/auth/token/",
        {"username": "local", "password": "pw-for-tests"},
        content_type="application/json",
    )
    assert taken.status_code == 200 and taken.json()["token"]
