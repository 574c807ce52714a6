"""App config for profiles_app: what Attune knows about workloads (catalog, profiles, predictors)."""

from django.apps import AppConfig


class ProfilesAppConfig(AppConfig):
    name = "profiles_app"
    verbose_name = "Profiles"
