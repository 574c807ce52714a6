"""Server.registered_at: only a server whose agent registered takes work; existing ones are marked."""

from django.db import migrations, models
from django.db.models import Exists, OuterRef


def mark_registered(apps, schema_editor) -> None:
    """Every server without a placeholder GPU (node_token's `unregistered-NAME-i`) had its inventory
    from an agent or from staff: it stays in service, dated from its last heartbeat or its creation.
    Servers still holding placeholders stay unregistered: the round no longer places work on them, and
    the liveness sweep requeues whatever a round had placed there."""
    Server = apps.get_model("cluster_app", "Server")
    Gpu = apps.get_model("cluster_app", "Gpu")
    ServerHeartbeat = apps.get_model("cluster_app", "ServerHeartbeat")
    placeholder = Gpu.objects.filter(server=OuterRef("pk"), uuid__startswith="unregistered-")
    for server in Server.objects.exclude(Exists(placeholder)):
        beat = ServerHeartbeat.objects.filter(server_id=server.pk).values_list("at", flat=True).first()
        Server.objects.filter(pk=server.pk).update(registered_at=beat or server.created_at)


class Migration(migrations.Migration):
    dependencies = [
        ("cluster_app", "0008_sample_indexes_deduplicated"),
    ]

    operations = [
        migrations.AddField(
            model_name="server",
            name="registered_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When its agent last registered its inventory; empty: never (placeholder GPUs from "
                "node_token or the admin), and the server takes no work until it does",
                null=True,
            ),
        ),
        migrations.RunPython(mark_registered, migrations.RunPython.noop),
    ]
