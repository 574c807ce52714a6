"""Sign-in fixtures: a private slapd with the lab's people and groups, a real OpenID Connect provider
process, and settings that turn either sign-in on the way an admin's environment would (through
config/auth_settings.py). Both servers start once per session; tests skip, saying why, without them."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import environ
import pytest

from config.auth_settings import sign_in_settings
from tests.auth.ldap_server import GROUPS, PEOPLE, LabGroup, LabUser, Slapd, slapd_missing
from tests.auth.oidc_server import OIDCProvider, ProviderUser, provider_missing

# The browser tests use the suite's chromium and page fixtures (tests/browser_support.py).

LDAP_USERS = [
    LabUser("alice", "alice-ldap-pw", "Alice", "Liddell", 10001),
    LabUser("bob", "bob-ldap-pw", "Bob", "Builder", 10002),
]
LDAP_GROUPS = [
    LabGroup("vision-lab", ("alice",)),
    LabGroup("nlp-lab", ("bob",)),
    LabGroup("hpc-admins", ("bob",)),
]
OIDC_USERS = [
    ProviderUser("carol", "carol-idp-pw", "Carol Danvers", "carol@lab.example", ["vision-lab"]),
    ProviderUser("dave", "dave-idp-pw", "Dave Lister", "dave@lab.example", ["/nlp-lab", "hpc-admins"]),
]
# Group -> team, and the staff group, as an admin writes them (docs/auth.md).
SSO_ENV = {"ATTUNE_SSO_TEAMS": "vision-lab=vision,nlp-lab=nlp", "ATTUNE_SSO_STAFF_GROUPS": "hpc-admins"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def slapd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slapd]:
    why = slapd_missing()
    if why:
        pytest.skip(why)
    server = Slapd(tmp_path_factory.mktemp("slapd"), free_port()).start()
    try:
        server.add_lab(LDAP_USERS, LDAP_GROUPS)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory: pytest.TempPathFactory, live_server) -> Iterator[OIDCProvider]:
    why = provider_missing()
    if why:
        pytest.skip(why)
    provider = OIDCProvider(
        tmp_path_factory.mktemp("oidc"),
        free_port(),
        client_id="attune",
        client_secret="attune-client-secret",
        redirect_uris=[f"{live_server.url}/oidc/callback/"],
        users=OIDC_USERS,
    ).start()
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture
def apply_sign_in_env(settings, monkeypatch) -> Callable[[dict[str, str]], dict]:
    """Set these environment variables and apply config/auth_settings.py's result to the settings, as
    config/settings.py does at start-up; returns that result."""

    def apply(variables: dict[str, str]) -> dict:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        result = sign_in_settings(environ.Env())
        for name, value in result.items():
            setattr(settings, name, value)
        settings.AUTHENTICATION_BACKENDS = [
            "axes.backends.AxesStandaloneBackend",
            *result["ATTUNE_SIGN_IN_BACKENDS"],
            "django.contrib.auth.backends.ModelBackend",
        ]
        return result

    return apply


def ldap_env(server: Slapd) -> dict[str, str]:
    return {
        "ATTUNE_LDAP_URI": server.uri,
        "ATTUNE_LDAP_USER_BASE": PEOPLE,
        "ATTUNE_LDAP_GROUP_BASE": GROUPS,
        **SSO_ENV,
    }


@pytest.fixture
def ldap_on(slapd: Slapd, apply_sign_in_env) -> Slapd:
    """LDAP sign-in against the private slapd (anonymous search, groupOfNames), groups mapped."""
    apply_sign_in_env(ldap_env(slapd))
    return slapd


@pytest.fixture
def oidc_on(oidc_provider: OIDCProvider, apply_sign_in_env) -> OIDCProvider:
    """OpenID Connect sign-in through the provider process, groups mapped."""
    apply_sign_in_env({**oidc_provider.environment(), **SSO_ENV})
    return oidc_provider


@pytest.fixture
def token_file(tmp_path: Path, monkeypatch) -> Path:
    """Where the CLI saves its login in this test."""
    path = tmp_path / "attune-token"
    monkeypatch.setenv("ATTUNE_TOKEN_FILE", str(path))
    return path
