"""config/auth_settings.py: both sign-ins off by default, on by their variables, refused when half-set."""

from __future__ import annotations

import os
import sys

import environ
import pytest
from django.core.exceptions import ImproperlyConfigured

from config.auth_settings import LDAP_BACKEND, OIDC_BACKEND, sign_in_settings

OIDC_ENDPOINTS = {
    "ATTUNE_OIDC_AUTHORIZATION_ENDPOINT": "https://idp.example/auth",
    "ATTUNE_OIDC_TOKEN_ENDPOINT": "https://idp.example/token",
    "ATTUNE_OIDC_USERINFO_ENDPOINT": "https://idp.example/userinfo",
    "ATTUNE_OIDC_JWKS_ENDPOINT": "https://idp.example/jwks",
}


def settings_from(monkeypatch, **variables: str) -> dict:
    for name in list(os.environ):
        if name.startswith(("ATTUNE_LDAP_", "ATTUNE_OIDC_", "ATTUNE_SSO_")):
            monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return sign_in_settings(environ.Env())


def test_off_by_default(monkeypatch):
    out = settings_from(monkeypatch)
    assert out["ATTUNE_SIGN_IN_BACKENDS"] == []
    assert not out["ATTUNE_LDAP_ENABLED"] and not out["ATTUNE_OIDC_ENABLED"]
    assert "AUTH_LDAP_SERVER_URI" not in out and "OIDC_RP_CLIENT_ID" not in out


def test_ldap_on(monkeypatch):
    out = settings_from(
        monkeypatch,
        ATTUNE_LDAP_URI="ldaps://ldap.uni.example",
        ATTUNE_LDAP_USER_BASE="ou=people,dc=uni,dc=example",
        ATTUNE_LDAP_GROUP_BASE="ou=groups,dc=uni,dc=example",
        ATTUNE_LDAP_GROUP_TYPE="posixGroup",
        ATTUNE_SSO_TEAMS="vision-lab=vision,nlp=nlp",
        ATTUNE_SSO_STAFF_GROUPS="hpc-admins,ops",
    )
    assert out["ATTUNE_SIGN_IN_BACKENDS"] == [LDAP_BACKEND]
    assert out["AUTH_LDAP_USER_SEARCH"].filterstr == "(uid=%(user)s)"
    assert out["AUTH_LDAP_GROUP_SEARCH"].filterstr == "(objectClass=posixGroup)"
    assert type(out["AUTH_LDAP_GROUP_TYPE"]).__name__ == "PosixGroupType"
    assert out["ATTUNE_SSO"]["teams"] == {"vision-lab": "vision", "nlp": "nlp"}
    assert out["ATTUNE_SSO"]["staff_groups"] == ["hpc-admins", "ops"]


def test_ldap_needs_a_way_to_find_the_user(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match="ATTUNE_LDAP_USER_BASE"):
        settings_from(monkeypatch, ATTUNE_LDAP_URI="ldap://ldap.example")


def test_ldap_refuses_an_unknown_group_type(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match="ATTUNE_LDAP_GROUP_TYPE"):
        settings_from(
            monkeypatch,
            ATTUNE_LDAP_URI="ldap://ldap.example",
            ATTUNE_LDAP_USER_DN_TEMPLATE="uid=%(user)s,ou=people,dc=example",
            ATTUNE_LDAP_GROUP_TYPE="activeDirectory",
        )


def test_oidc_on(monkeypatch):
    out = settings_from(monkeypatch, ATTUNE_OIDC_CLIENT_ID="attune", **OIDC_ENDPOINTS)
    assert out["ATTUNE_SIGN_IN_BACKENDS"] == [OIDC_BACKEND]
    assert out["OIDC_OP_USER_ENDPOINT"] == "https://idp.example/userinfo"
    assert out["OIDC_RP_SIGN_ALGO"] == "RS256" and out["OIDC_USE_PKCE"] is True
    assert out["ATTUNE_OIDC"]["username_claim"] == out["ATTUNE_OIDC"]["unix_claim"] == "preferred_username"


def test_oidc_names_the_missing_endpoints(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match="ATTUNE_OIDC_JWKS_ENDPOINT"):
        settings_from(
            monkeypatch,
            ATTUNE_OIDC_CLIENT_ID="attune",
            **{k: v for k, v in OIDC_ENDPOINTS.items() if "JWKS" not in k},
        )


def test_ldap_without_its_libraries_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ldap", None)  # as if python-ldap were not installed
    with pytest.raises(ImproperlyConfigured, match=r"requirements-ldap\.txt"):
        settings_from(
            monkeypatch, ATTUNE_LDAP_URI="ldap://ldap.example", ATTUNE_LDAP_USER_BASE="ou=people,dc=example"
        )
