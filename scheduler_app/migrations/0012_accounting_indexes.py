"""Accounting indexes (selectors/accounting.py): leases that ended, jobs that ended or started."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_app", "0011_job_forecast"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="allocation",
            index=models.Index(fields=["ended_at"], name="scheduler_a_ended_a_123a54_idx"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["finished_at"], name="scheduler_a_finishe_0ca092_idx"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["started_at"], name="scheduler_a_started_987568_idx"),
        ),
    ]
