"""SchedulingRound.num_resized: running jobs a round resized in place."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_app", "0024_restart_costs"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedulinground",
            name="num_resized",
            field=models.PositiveIntegerField(
                default=0,
                help_text="Running jobs given other cores or memory in place (same GPUs, no restart)",
            ),
        ),
    ]
