"""Heartbeats move from Server.last_heartbeat_at to a table of their own (ServerHeartbeat)."""

import django.db.models.deletion
from django.db import migrations, models


def heartbeats_copy(apps, schema_editor):
    Server = apps.get_model("cluster_app", "Server")
    ServerHeartbeat = apps.get_model("cluster_app", "ServerHeartbeat")
    ServerHeartbeat.objects.bulk_create(
        ServerHeartbeat(server_id=pk, at=at)
        for pk, at in Server.objects.filter(last_heartbeat_at__isnull=False).values_list(
            "pk", "last_heartbeat_at"
        )
    )


def heartbeats_restore(apps, schema_editor):
    Server = apps.get_model("cluster_app", "Server")
    ServerHeartbeat = apps.get_model("cluster_app", "ServerHeartbeat")
    for server_id, at in ServerHeartbeat.objects.values_list("server_id", "at"):
        Server.objects.filter(pk=server_id).update(last_heartbeat_at=at)


class Migration(migrations.Migration):
    dependencies = [
        ("cluster_app", "0006_server_time_scale"),
    ]

    operations = [
        migrations.CreateModel(
            name="ServerHeartbeat",
            fields=[
                (
                    "server",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="heartbeat",
                        serialize=False,
                        to="cluster_app.server",
                    ),
                ),
                ("at", models.DateTimeField(help_text="the service's clock when the last heartbeat arrived")),
            ],
        ),
        migrations.RunPython(heartbeats_copy, heartbeats_restore),
        migrations.RemoveField(model_name="server", name="last_heartbeat_at"),
    ]
