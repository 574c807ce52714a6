"""Server.live_resize: whether its agent resizes running leases in place (the `resize` feature)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cluster_app", "0010_usage_rollup_mark"),
    ]

    operations = [
        migrations.AddField(
            model_name="server",
            name="live_resize",
            field=models.BooleanField(
                default=False,
                help_text="Its agent applies a new size (cores, memory) to a running lease in place "
                "(registered feature `resize`); otherwise a round restarts a job whose cores or memory change",
            ),
        ),
    ]
