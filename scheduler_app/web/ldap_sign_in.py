"""The LDAP sign-in backend: django-auth-ldap's, plus Attune's group mapping at each sign-in.

Named in AUTHENTICATION_BACKENDS by config/auth_settings.py when ATTUNE_LDAP_URI is set; needs
requirements-ldap.txt (python-ldap). The user's groups go to scheduler_app.services.sign_in, which sets
their teams, staff flags and Unix account.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django_auth_ldap.backend import LDAPBackend, _LDAPUser

from scheduler_app.services.sign_in import sign_in_sync


class LabLDAPBackend(LDAPBackend):
    """django-auth-ldap's bind (search, then bind as the user with their password) and user update.

    Only the web's login forms take a directory password: the API's token endpoint (the CLI's
    `login --username`) is for local accounts, so an LDAP password never passes through the CLI; LDAP
    users copy a token from the web page instead (docs/auth.md).
    """

    def authenticate(self, request: Any, username: Any = None, password: Any = None, **kwargs: Any) -> Any:
        if request is not None and request.path.startswith("/api/"):
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)

    def authenticate_ldap_user(self, ldap_user: _LDAPUser, password: str) -> Any:
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is None:
            return None
        # Without a group search the directory says nothing about groups: no team changes then.
        groups = ldap_user.group_names if getattr(settings, "AUTH_LDAP_GROUP_SEARCH", None) else ()
        unix_attr = getattr(settings, "ATTUNE_LDAP_UNIX_ATTR", "uid")
        values = (ldap_user.attrs or {}).get(unix_attr) or []
        sign_in_sync(user, groups=groups, unix_name=values[0] if values else None)
        return user
