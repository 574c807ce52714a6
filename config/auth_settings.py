"""Sign-in with the lab's accounts: LDAP (django-auth-ldap) and OpenID Connect (mozilla-django-oidc).

config/settings.py merges `sign_in_settings(env)` into its own names; docs/auth.md describes every
variable. LDAP is on when ATTUNE_LDAP_URI is set (its libraries: requirements-ldap.txt), OpenID Connect
when ATTUNE_OIDC_CLIENT_ID is; both are off by default, and local passwords (ModelBackend) always stay.
"""

from __future__ import annotations

from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

LDAP_BACKEND = "scheduler_app.web.ldap_sign_in.LabLDAPBackend"
OIDC_BACKEND = "scheduler_app.web.oidc_sign_in.LabOIDCBackend"
# The group types a lab's directory uses, by the objectClass of its group entries.
LDAP_GROUP_TYPES = ("groupOfNames", "groupOfUniqueNames", "posixGroup", "nestedGroupOfNames")


def sign_in_settings(env: environ.Env) -> dict[str, Any]:
    """The Django settings of both sign-ins and of the group mapping, read from the environment."""
    out: dict[str, Any] = {
        # Sign-in backends to add after axes's and before the local passwords' (settings.py keeps both).
        "ATTUNE_SIGN_IN_BACKENDS": [],
        "ATTUNE_LDAP_ENABLED": False,
        "ATTUNE_OIDC_ENABLED": False,
        "ATTUNE_SSO": {
            # Directory/provider group name -> Attune team name; a member is put in the team at each
            # sign-in and taken out of it when no longer in the group. Teams named nowhere here are
            # left alone (staff keep managing them in the admin).
            "teams": env.dict("ATTUNE_SSO_TEAMS", default={}),
            "create_teams": env.bool("ATTUNE_SSO_CREATE_TEAMS", default=True),
            # Empty: is_staff / is_superuser are left as the admin set them; given: the groups decide.
            "staff_groups": env.list("ATTUNE_SSO_STAFF_GROUPS", default=[]),
            "superuser_groups": env.list("ATTUNE_SSO_SUPERUSER_GROUPS", default=[]),
        },
    }
    ldap_uri = env("ATTUNE_LDAP_URI", default="")
    if ldap_uri:
        out.update(_ldap_settings(env, ldap_uri))
        out["ATTUNE_LDAP_ENABLED"] = True
        out["ATTUNE_SIGN_IN_BACKENDS"].append(LDAP_BACKEND)
    client_id = env("ATTUNE_OIDC_CLIENT_ID", default="")
    if client_id:
        out.update(_oidc_settings(env, client_id))
        out["ATTUNE_OIDC_ENABLED"] = True
        out["ATTUNE_SIGN_IN_BACKENDS"].append(OIDC_BACKEND)
    return out


def _ldap_settings(env: environ.Env, uri: str) -> dict[str, Any]:
    """django-auth-ldap's AUTH_LDAP_* settings (python-ldap is imported only when LDAP is on)."""
    # Lazily: a lab without LDAP needs no python-ldap (a C extension that builds from source) to start.
    try:
        import ldap  # noqa: PLC0415
        from django_auth_ldap.config import (  # noqa: PLC0415
            GroupOfNamesType,
            GroupOfUniqueNamesType,
            LDAPSearch,
            NestedGroupOfNamesType,
            PosixGroupType,
        )
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"ATTUNE_LDAP_URI is set but LDAP's libraries are missing ({exc}): pip install -r "
            "requirements-ldap.txt (it builds against libldap-dev and libsasl2-dev)"
        ) from exc

    group_type_name = env("ATTUNE_LDAP_GROUP_TYPE", default="groupOfNames")
    group_types = {
        "groupOfNames": GroupOfNamesType,
        "groupOfUniqueNames": GroupOfUniqueNamesType,
        "posixGroup": PosixGroupType,
        "nestedGroupOfNames": NestedGroupOfNamesType,
    }
    if group_type_name not in group_types:
        raise ImproperlyConfigured(
            f"ATTUNE_LDAP_GROUP_TYPE is one of {', '.join(LDAP_GROUP_TYPES)}, not {group_type_name!r}"
        )
    user_base = env("ATTUNE_LDAP_USER_BASE", default="")
    dn_template = env("ATTUNE_LDAP_USER_DN_TEMPLATE", default="")
    if not user_base and not dn_template:
        raise ImproperlyConfigured(
            "ATTUNE_LDAP_URI is set: give ATTUNE_LDAP_USER_BASE (search for the user) or "
            "ATTUNE_LDAP_USER_DN_TEMPLATE (bind as uid=%(user)s,ou=people,...)"
        )
    out: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_BIND_DN": env("ATTUNE_LDAP_BIND_DN", default=""),
        "AUTH_LDAP_BIND_PASSWORD": env("ATTUNE_LDAP_BIND_PASSWORD", default=""),
        "AUTH_LDAP_START_TLS": env.bool("ATTUNE_LDAP_START_TLS", default=False),
        # The user's Unix account name on the nodes (jobs run as it unless staff mapped another).
        "ATTUNE_LDAP_UNIX_ATTR": env("ATTUNE_LDAP_UNIX_ATTR", default="uid"),
        "AUTH_LDAP_USER_ATTR_MAP": {
            "first_name": env("ATTUNE_LDAP_ATTR_FIRST_NAME", default="givenName"),
            "last_name": env("ATTUNE_LDAP_ATTR_LAST_NAME", default="sn"),
            "email": env("ATTUNE_LDAP_ATTR_EMAIL", default="mail"),
        },
        # Groups are read at each sign-in, so a change in the directory shows at the next one.
        "AUTH_LDAP_FIND_GROUP_PERMS": False,
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_CONNECTION_OPTIONS": {
            ldap.OPT_NETWORK_TIMEOUT: env.float("ATTUNE_LDAP_TIMEOUT_S", default=5.0),
            ldap.OPT_TIMEOUT: env.float("ATTUNE_LDAP_TIMEOUT_S", default=5.0),
            ldap.OPT_REFERRALS: 0,  # Active Directory's referrals would need another bind
        },
    }
    ca_file = env("ATTUNE_LDAP_CA_FILE", default="")
    if ca_file:
        out["AUTH_LDAP_CONNECTION_OPTIONS"].update(
            {ldap.OPT_X_TLS_CACERTFILE: ca_file, ldap.OPT_X_TLS_NEWCTX: 0}
        )
    if dn_template:
        out["AUTH_LDAP_USER_DN_TEMPLATE"] = dn_template
    else:
        out["AUTH_LDAP_USER_SEARCH"] = LDAPSearch(
            user_base, ldap.SCOPE_SUBTREE, env("ATTUNE_LDAP_USER_FILTER", default="(uid=%(user)s)")
        )
    group_base = env("ATTUNE_LDAP_GROUP_BASE", default="")
    if group_base:
        object_class = "groupOfNames" if group_type_name.startswith("nested") else group_type_name
        default_filter = f"(objectClass={object_class})"
        out["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(
            group_base, ldap.SCOPE_SUBTREE, env("ATTUNE_LDAP_GROUP_FILTER", default=default_filter)
        )
        out["AUTH_LDAP_GROUP_TYPE"] = group_types[group_type_name](
            name_attr=env("ATTUNE_LDAP_GROUP_NAME_ATTR", default="cn")
        )
    require_group = env("ATTUNE_LDAP_REQUIRE_GROUP", default="")
    if require_group:
        if not group_base:
            raise ImproperlyConfigured("ATTUNE_LDAP_REQUIRE_GROUP needs ATTUNE_LDAP_GROUP_BASE")
        out["AUTH_LDAP_REQUIRE_GROUP"] = require_group
    return out


def _oidc_settings(env: environ.Env, client_id: str) -> dict[str, Any]:
    """mozilla-django-oidc's OIDC_* settings and Attune's own claims' names."""
    endpoints = {
        "OIDC_OP_AUTHORIZATION_ENDPOINT": "ATTUNE_OIDC_AUTHORIZATION_ENDPOINT",
        "OIDC_OP_TOKEN_ENDPOINT": "ATTUNE_OIDC_TOKEN_ENDPOINT",
        "OIDC_OP_USER_ENDPOINT": "ATTUNE_OIDC_USERINFO_ENDPOINT",
        "OIDC_OP_JWKS_ENDPOINT": "ATTUNE_OIDC_JWKS_ENDPOINT",
    }
    out: dict[str, Any] = {name: env(var, default="") for name, var in endpoints.items()}
    missing = [var for name, var in endpoints.items() if not out[name]]
    if missing:
        raise ImproperlyConfigured(
            f"ATTUNE_OIDC_CLIENT_ID is set: give {', '.join(missing)} too (the provider's "
            "/.well-known/openid-configuration lists them; docs/auth.md)"
        )
    username_claim = env("ATTUNE_OIDC_USERNAME_CLAIM", default="preferred_username")
    out.update(
        {
            "OIDC_RP_CLIENT_ID": client_id,
            "OIDC_RP_CLIENT_SECRET": env("ATTUNE_OIDC_CLIENT_SECRET", default=""),
            "OIDC_RP_SIGN_ALGO": env("ATTUNE_OIDC_SIGN_ALGO", default="RS256"),
            "OIDC_RP_SCOPES": env("ATTUNE_OIDC_SCOPES", default="openid email profile"),
            "OIDC_USE_PKCE": env.bool("ATTUNE_OIDC_USE_PKCE", default=True),
            "OIDC_TOKEN_USE_BASIC_AUTH": env.bool("ATTUNE_OIDC_TOKEN_USE_BASIC_AUTH", default=False),
            "OIDC_TIMEOUT": env.float("ATTUNE_OIDC_TIMEOUT_S", default=10.0),
            # A refused or failed sign-in goes back to the login page, which says so.
            "LOGIN_REDIRECT_URL_FAILURE": "/accounts/login/?sso=failed",
            "ATTUNE_OIDC": {
                "label": env("ATTUNE_OIDC_LABEL", default="Sign in with your lab account"),
                "username_claim": username_claim,
                "unix_claim": env("ATTUNE_OIDC_UNIX_CLAIM", default=username_claim),
                "groups_claim": env("ATTUNE_OIDC_GROUPS_CLAIM", default="groups"),
                "require_group": env("ATTUNE_OIDC_REQUIRE_GROUP", default=""),
            },
        }
    )
    return out
