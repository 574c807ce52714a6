"""After an LDAP or OpenID Connect sign-in: teams and staff flags from the user's groups, the Unix account.

The only writer of team memberships and Unix-account rows that a directory decides; called by the
sign-in backends (scheduler_app/web/ldap_sign_in.py, oidc_sign_in.py) at every sign-in, so the
directory's changes show at the user's next one. The mapping is settings.ATTUNE_SSO
(config/auth_settings.py, docs/auth.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from scheduler_app.job_accounts import run_as_problem
from scheduler_app.models import Team, UnixAccount

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SignInMapping:
    """Group name -> team name, whether missing teams are created, the staff and superuser groups."""

    teams: dict[str, str]
    create_teams: bool
    staff_groups: frozenset[str]
    superuser_groups: frozenset[str]


def sign_in_mapping() -> SignInMapping:
    # Read on every call so that tests can override settings.
    raw = getattr(settings, "ATTUNE_SSO", {}) or {}
    return SignInMapping(
        teams={str(g).strip(): str(t).strip() for g, t in (raw.get("teams") or {}).items()},
        create_teams=bool(raw.get("create_teams", True)),
        staff_groups=frozenset(g.strip() for g in raw.get("staff_groups") or () if g.strip()),
        superuser_groups=frozenset(g.strip() for g in raw.get("superuser_groups") or () if g.strip()),
    )


@dataclass(frozen=True)
class SignInSync:
    """What one sign-in changed: teams joined and left, the staff flags now, the Unix account row."""

    joined: tuple[str, ...]
    left: tuple[str, ...]
    is_staff: bool
    is_superuser: bool
    unix_user: str | None  # the mapped account, None when jobs run as the username


@transaction.atomic
def sign_in_sync(
    user: AbstractBaseUser,
    *,
    groups: Iterable[str],
    unix_name: str | None = None,
    mapping: SignInMapping | None = None,
) -> SignInSync:
    """Make `user`'s mapped teams and staff flags match `groups`; give them a Unix account row when their
    account name (`unix_name`) is not their username, unless staff already mapped one.

    Only teams the mapping names are joined or left: a team staff manage by hand keeps its members.
    """
    mapping = mapping or sign_in_mapping()
    group_set = {g for g in groups if g}
    wanted = {mapping.teams[g] for g in group_set if g in mapping.teams}
    mapped = set(mapping.teams.values())
    current = set(user.attune_teams.filter(name__in=mapped).values_list("name", flat=True))
    joined = []
    for name in sorted(wanted - current):
        team = Team.objects.filter(name=name).first()
        if team is None:
            if not mapping.create_teams:
                log.warning("sign-in of %s: no team %r (ATTUNE_SSO_CREATE_TEAMS is off)", user, name)
                continue
            team, _ = Team.objects.get_or_create(name=name)
        team.members.add(user)
        joined.append(name)
    left = sorted(current - wanted)
    if left:
        user.attune_teams.remove(*Team.objects.filter(name__in=left))
    fields = []
    if mapping.staff_groups:
        user.is_staff = bool(group_set & mapping.staff_groups)
        fields.append("is_staff")
    if mapping.superuser_groups:
        user.is_superuser = bool(group_set & mapping.superuser_groups)
        fields.append("is_superuser")
    if user.is_superuser and not user.is_staff:
        user.is_staff = True  # the admin refuses a superuser who is not staff
        fields.append("is_staff")
    if fields:
        user.save(update_fields=sorted(set(fields)))
    return SignInSync(
        joined=tuple(joined),
        left=tuple(left),
        is_staff=user.is_staff,
        is_superuser=user.is_superuser,
        unix_user=_unix_account_default(user, unix_name),
    )


def _unix_account_default(user: AbstractBaseUser, unix_name: str | None) -> str | None:
    """The user's Unix account row: kept if staff set one; created when the directory's account name
    differs from the username (an e-mail as username, say); none needed when they are the same."""
    existing = UnixAccount.objects.filter(user=user).first()
    if existing is not None:
        return existing.unix_user
    if not unix_name or unix_name == user.get_username():
        return None
    problem = run_as_problem(unix_name)
    if problem:
        # Jobs then run as the username, which the submission check refuses the same way if unfit.
        log.warning("sign-in of %s: Unix account %r not mapped: %s", user, unix_name, problem)
        return None
    UnixAccount.objects.create(user=user, unix_user=unix_name)
    return unix_name
