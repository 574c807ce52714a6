"""The database vendor checks: PostgreSQL in production and CI, SQLite for the embedded demo."""

from __future__ import annotations

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper


def is_postgresql(db: BaseDatabaseWrapper | None = None) -> bool:
    """Whether `db` (the default connection when None) is PostgreSQL; everything else here is SQLite."""
    return (db or connection).vendor == "postgresql"
