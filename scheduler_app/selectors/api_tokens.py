"""A user's personal API token, for the page that shows it."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from rest_framework.authtoken.models import Token


def api_token_of(user: AbstractBaseUser) -> str | None:
    """The user's token, or None before they made one."""
    return Token.objects.filter(user=user).values_list("key", flat=True).first()
