"""AgentReport.batch_id keeps its column but loses its index: no query reads it (the sync learns which
reports it inserted from its INSERT ... RETURNING), and every report stored wrote it."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_app", "0020_jobendpending"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="agentreport",
            name="scheduler_a_batch_i_11ae4e_idx",
        ),
    ]
