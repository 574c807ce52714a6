"""A user's API token checked in one written-out statement: DRF's TokenAuthentication, same answers."""

from __future__ import annotations

from functools import cache

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils.translation import gettext_lazy as _
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token


@cache
def _statement() -> tuple[str, list[str], list[str]]:
    """The token's and its user's columns in one SELECT, and their attribute names (built once)."""
    user_model = get_user_model()
    quote = connection.ops.quote_name
    token_fields = [f.attname for f in Token._meta.concrete_fields]
    user_fields = [f.attname for f in user_model._meta.concrete_fields]
    columns = [f"t.{quote(f.column)}" for f in Token._meta.concrete_fields]
    columns += [f"u.{quote(f.column)}" for f in user_model._meta.concrete_fields]
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(Token._meta.db_table)} t "
        f"JOIN {quote(user_model._meta.db_table)} u ON u.{quote(user_model._meta.pk.column)} = "
        f"t.{quote(Token._meta.get_field('user').column)} WHERE t.{quote(Token._meta.pk.column)} = %s"
    )
    return sql, token_fields, user_fields


class LeanTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>` as DRF's TokenAuthentication reads it (the same header checks, the
    same errors, request.auth the Token with its user), the token and its user read in one statement
    built once per process: the ORM's select_related query cost a submission more CPU to build than
    the rest of its authentication (bench.submit_cost)."""

    def authenticate_credentials(self, key):
        sql, token_fields, user_fields = _statement()
        with connection.cursor() as cursor:
            cursor.execute(sql, [key])
            row = cursor.fetchone()
        if row is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        db = connection.alias
        token = Token.from_db(db, token_fields, row[: len(token_fields)])
        user = get_user_model().from_db(db, user_fields, row[len(token_fields) :])
        token.user = user
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return user, token
