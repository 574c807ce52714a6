"""The OpenID Connect sign-in backend: mozilla-django-oidc's, plus Attune's username, group mapping and
Unix account at each sign-in.

Named in AUTHENTICATION_BACKENDS by config/auth_settings.py when ATTUNE_OIDC_CLIENT_ID is set. The user's
groups go to scheduler_app.services.sign_in, which sets their teams, staff flags and Unix account.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from scheduler_app.services.sign_in import sign_in_sync

log = logging.getLogger(__name__)


def _claim_text(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    return value.strip() if isinstance(value, str) else ""


class LabOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code flow (token, ID token checked against the JWKS, userinfo); users are
    matched by the username claim (preferred_username unless set), not by e-mail."""

    @staticmethod
    def _conf() -> dict[str, Any]:
        return settings.ATTUNE_OIDC

    def _username(self, claims: dict[str, Any]) -> str:
        return _claim_text(claims, self._conf()["username_claim"])

    def _groups(self, claims: dict[str, Any]) -> list[str]:
        raw = claims.get(self._conf()["groups_claim"]) or []
        if isinstance(raw, str):
            raw = [raw]
        # Keycloak's group mapper gives full paths ("/vision-lab") unless told otherwise.
        return [g[1:] if g.startswith("/") else g for g in raw if isinstance(g, str)]

    def describe_user_by_claims(self, claims: dict[str, Any]) -> str:
        return f"{self._conf()['username_claim']} {self._username(claims)!r}"

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not self._username(claims):
            log.warning("OIDC sign-in refused: no %r claim in the userinfo", self._conf()["username_claim"])
            return False
        required = self._conf()["require_group"]
        if required and required not in self._groups(claims):
            log.warning("OIDC sign-in of %r refused: not in the group %r", self._username(claims), required)
            return False
        return True

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet:
        return get_user_model().objects.filter(username=self._username(claims))

    def create_user(self, claims: dict[str, Any]) -> Any:
        # No password: this user signs in through the provider only (until staff give one).
        user = get_user_model().objects.create_user(self._username(claims))
        return self.update_user(user, claims)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        changed = []
        for field, claim in (("email", "email"), ("first_name", "given_name"), ("last_name", "family_name")):
            value = _claim_text(claims, claim)
            if value and getattr(user, field) != value:
                setattr(user, field, value)
                changed.append(field)
        if changed:
            user.save(update_fields=changed)
        unix_name = _claim_text(claims, self._conf()["unix_claim"])
        # An e-mail as the account claim (Google): its local part, as most labs name their accounts.
        sign_in_sync(user, groups=self._groups(claims), unix_name=unix_name.split("@", 1)[0] or None)
        return user
