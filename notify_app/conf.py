"""Notification settings: the only place that reads settings.ATTUNE_NOTIFY."""

from dataclasses import dataclass

from django.conf import settings

from notify_app.addresses import IPNetwork, networks_parse


@dataclass(frozen=True)
class NotifyConf:
    """Where job links point, how deliveries are retried, and whether a worker sends them."""

    site_url: str
    max_tries: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    webhook_timeout_s: float
    webhook_hosts: tuple[str, ...]
    # Networks webhooks may reach although not public (loopback, private...): empty, only public ones.
    webhook_allowed_networks: tuple[IPNetwork, ...]
    inline: bool
    test_interval_s: float


def notify_conf() -> NotifyConf:
    # Read on every call (a dict lookup) so that tests can override settings.
    raw = getattr(settings, "ATTUNE_NOTIFY", {})
    return NotifyConf(
        site_url=str(raw.get("site_url", "http://127.0.0.1:8000")).rstrip("/"),
        max_tries=max(1, int(raw.get("max_tries", 5))),
        retry_backoff_s=max(0.0, float(raw.get("retry_backoff_s", 30.0))),
        retry_backoff_max_s=max(0.0, float(raw.get("retry_backoff_max_s", 600.0))),
        webhook_timeout_s=float(raw.get("webhook_timeout_s", 10.0)),
        webhook_hosts=tuple(h.lower().lstrip(".") for h in raw.get("webhook_hosts", ()) if h),
        webhook_allowed_networks=networks_parse(raw.get("webhook_allowed_networks", ())),
        # No worker (the embedded demo) or eager Celery: deliver on a thread of this process instead.
        inline=bool(raw.get("inline", False)) or bool(settings.CELERY_TASK_ALWAYS_EAGER),
        test_interval_s=float(raw.get("test_interval_s", 10.0)),
    )
