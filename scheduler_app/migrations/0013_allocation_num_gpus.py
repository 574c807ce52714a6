"""Allocation.num_gpus: the GPUs a lease holds, counted from its AllocationGpu rows for existing leases."""

from django.db import migrations, models


def count_gpus(apps, schema_editor):
    """Every existing lease gets the count of its GPU rows (one UPDATE, on PostgreSQL and SQLite)."""
    Allocation = apps.get_model("scheduler_app", "Allocation")
    AllocationGpu = apps.get_model("scheduler_app", "AllocationGpu")
    held = (
        AllocationGpu.objects.filter(allocation=models.OuterRef("pk"))
        .order_by()
        .values("allocation")
        .annotate(n=models.Count("pk"))
        .values("n")
    )
    Allocation.objects.update(num_gpus=models.functions.Coalesce(models.Subquery(held), 0))


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_app", "0012_accounting_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="num_gpus",
            field=models.PositiveSmallIntegerField(default=0),
            preserve_default=False,
        ),
        migrations.RunPython(count_gpus, migrations.RunPython.noop),
    ]
