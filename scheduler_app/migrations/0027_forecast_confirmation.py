"""One row: when the stored forecast as a whole was last confirmed (services/forecast_as_of.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduler_app', '0026_job_pending_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='ForecastConfirmation',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ('confirmed_at', models.DateTimeField()),
            ],
        ),
    ]
