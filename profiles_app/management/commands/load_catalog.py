"""`manage.py load_catalog`: the shipped workload catalog, for a real deployment; idempotent, no users."""

from django.core.management.base import BaseCommand, CommandError, CommandParser

from profiles_app.catalog import DEFAULT_PROFILE_SET, CatalogError
from profiles_app.services.workloads import workload_catalog_load


class Command(BaseCommand):
    help = (
        "Load the shipped workload catalog (Synergy's model profiles) into the database, or bring it up "
        "to date after an upgrade. Idempotent: run it after every migrate (docker-compose.yml does). "
        "Workloads profiled or registered on this cluster keep their own profile, and what finished jobs "
        "taught (speed correction, placement penalty) is kept. Creates no user, server or job (seed_demo "
        "is for demos only)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--profile-set",
            default=DEFAULT_PROFILE_SET,
            help=f"which of the catalog's profile sets (default {DEFAULT_PROFILE_SET}: 3 cores per GPU)",
        )

    def handle(self, *args, **opts) -> None:
        try:
            loaded = workload_catalog_load(profile_set=opts["profile_set"])
        except CatalogError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"workload catalog ({opts['profile_set']}): {loaded.total} models: {loaded.created} created, "
            f"{loaded.updated} updated, {loaded.unchanged} unchanged, {loaded.kept} kept as profiled or "
            "registered here"
        )
