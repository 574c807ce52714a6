"""JobForecast.position: a pending job's place in the queue, stored after each round."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduler_app', '0013_allocation_num_gpus'),
    ]

    operations = [
        migrations.AddField(
            model_name='jobforecast',
            name='position',
            field=models.PositiveIntegerField(blank=True, help_text="A pending job's place in the policy's order at the last round", null=True),
        ),
    ]
