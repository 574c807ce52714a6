"""Moved to infra/bulk_sql.py; this path re-exports it until its last importer points there."""

from infra.bulk_sql import insert_new, update_from_values

__all__ = ["insert_new", "update_from_values"]
