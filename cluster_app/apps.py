"""App config for cluster_app: the hardware (servers, GPUs, agent credentials, usage samples)."""

from django.apps import AppConfig


class ClusterAppConfig(AppConfig):
    name = "cluster_app"
    verbose_name = "Cluster"

    def ready(self) -> None:
        from cluster_app import lookups  # noqa: F401  (registers the `__any` lookup)
