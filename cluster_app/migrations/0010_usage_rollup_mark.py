"""UsageRollupMark: how far the usage roll-up has folded raw samples, where its next run looks from."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("cluster_app", "0009_server_registered_at"),
    ]

    operations = [
        migrations.CreateModel(
            name="UsageRollupMark",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "rolled_until",
                    models.DateTimeField(help_text="every raw sample before this was rolled up (UTC)"),
                ),
            ],
        ),
    ]
