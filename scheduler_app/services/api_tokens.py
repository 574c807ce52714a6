"""A user's personal API token (DRF's authtoken): created or replaced from the web, never from a password
sent through the CLI by a user who signs in with LDAP or OpenID Connect."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from rest_framework.authtoken.models import Token


@transaction.atomic
def api_token_rotate(user: AbstractBaseUser) -> str:
    """A new token for `user`; the old one (if any) stops working at once."""
    Token.objects.filter(user=user).delete()
    return Token.objects.create(user=user).key
