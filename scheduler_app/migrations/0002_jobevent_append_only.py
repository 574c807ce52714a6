"""Make JobEvent append-only in PostgreSQL: a trigger refuses UPDATE and DELETE of its rows."""

from django.db import migrations

CREATE_SQL = """
CREATE OR REPLACE FUNCTION scheduler_app_jobevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'job events are append-only (% refused)', TG_OP USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER scheduler_app_jobevent_append_only
    BEFORE UPDATE OR DELETE ON scheduler_app_jobevent
    FOR EACH ROW EXECUTE FUNCTION scheduler_app_jobevent_append_only();
"""

DROP_SQL = """
DROP TRIGGER IF EXISTS scheduler_app_jobevent_append_only ON scheduler_app_jobevent;
DROP FUNCTION IF EXISTS scheduler_app_jobevent_append_only();
"""


def create_trigger(apps, schema_editor) -> None:
    # SQLite (the embedded demo) has no plpgsql; there the admin and services keep events read-only.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE_SQL, params=None)


def drop_trigger(apps, schema_editor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_SQL, params=None)


class Migration(migrations.Migration):
    dependencies = [("scheduler_app", "0001_initial")]
    operations = [migrations.RunPython(create_trigger, drop_trigger)]
