"""App config for cluster_app: the hardware (servers, GPUs, agent credentials, usage samples)."""

from django.apps import AppConfig


class ClusterAppConfig(AppConfig):
    name = "cluster_app"
    verbose_name = "Cluster"

    def ready(self) -> None:
        from cluster_app import checks, lookups  # noqa: F401, PLC0415 - registers the `__any` lookup and the checks once models load
