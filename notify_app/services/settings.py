"""A user's notification settings: which channels and events they opted in to, and a test send on them."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse

from notify_app.addresses import REFUSED, webhook_url_refused
from notify_app.conf import notify_conf
from notify_app.models import NotificationChannel, NotificationEvent, NotificationSettings
from notify_app.senders import (
    DeliveryError,
    Message,
    email_send,
    webhook_host,
    webhook_host_allowed,
    webhook_send,
)

logger = logging.getLogger(__name__)

# The settings flag that turns each event on.
EVENT_FLAGS = {
    NotificationEvent.END: "on_end",
    NotificationEvent.FAILURE: "on_failure",
    NotificationEvent.QOS_AT_RISK: "on_qos_at_risk",
}


class NotificationTestThrottledError(Exception):
    """A test notification was sent moments ago: wait before sending another."""


@transaction.atomic
def notification_settings_save(
    *,
    user: AbstractBaseUser,
    email_enabled: bool,
    email: str,
    webhook_url: str,
    on_end: bool,
    on_failure: bool,
    on_qos_at_risk: bool,
) -> NotificationSettings:
    """Create or update the user's settings; raises ValidationError (by field) when they are wrong."""
    prefs, _ = NotificationSettings.objects.select_for_update().get_or_create(user=user)
    prefs.email_enabled = email_enabled
    prefs.email = email.strip()
    prefs.webhook_url = webhook_url.strip()
    prefs.on_end, prefs.on_failure, prefs.on_qos_at_risk = on_end, on_failure, on_qos_at_risk
    prefs.full_clean(exclude=["user"])
    errors: dict[str, str] = {}
    if prefs.email_enabled and not (prefs.email or getattr(user, "email", "")):
        errors["email"] = "Your account has no email address: give one here, or turn emails off."
    conf = notify_conf()
    if prefs.webhook_url and not webhook_host_allowed(prefs.webhook_url, conf.webhook_hosts):
        errors["webhook_url"] = (
            f"Webhooks may only go to {', '.join(conf.webhook_hosts)} on this cluster "
            f"(not {webhook_host(prefs.webhook_url)})."
        )
    elif prefs.webhook_url and webhook_url_refused(prefs.webhook_url, conf.webhook_allowed_networks):
        errors["webhook_url"] = (
            f"Webhooks may not go to {webhook_host(prefs.webhook_url)}: {REFUSED}. Give a public URL "
            "(an operator can allow internal networks: ATTUNE_NOTIFY_WEBHOOK_ALLOWED_NETWORKS)."
        )
    if errors:
        raise ValidationError(errors)
    prefs.save()
    return prefs


def notification_settings_of(user_ids: Iterable[int]) -> dict[int, NotificationSettings]:
    """user -> their notification settings, for those of `user_ids` who have any, in one query."""
    rows = NotificationSettings.objects.select_related("user").filter(user_id__in=set(user_ids))
    return {prefs.user_id: prefs for prefs in rows}


def notification_test_send(*, user: AbstractBaseUser) -> list[tuple[str, str]]:
    """Send a test message now, on each channel the user's saved settings turn on; (channel, outcome)
    pairs, where the outcome is "sent" or why not. Raises NotificationTestThrottledError when the user
    sent one moments ago (the button must not make the service a mail or HTTP cannon)."""
    conf = notify_conf()
    if not cache.add(f"notify-test:{user.pk}", 1, timeout=conf.test_interval_s):
        raise NotificationTestThrottledError(
            f"A test notification was sent less than {conf.test_interval_s:g} s ago."
        )
    prefs = NotificationSettings.objects.filter(user=user).first()
    url = f"{conf.site_url}{reverse('notify:settings')}"
    text = f"A test notification from Attune for {user.get_username()}: this channel works."
    message = Message(
        subject="[Attune] Test notification",
        text=f"{text}\n{url}",
        key=f"attune-test-{user.pk}-{int(time.time())}",
        fields={"event": "test", "url": url, "user": user.get_username()},
    )
    results: list[tuple[str, str]] = []
    to = (prefs.email or getattr(user, "email", "")) if prefs is not None else ""
    if prefs is not None and prefs.email_enabled and to:
        results.append((NotificationChannel.EMAIL, _try(lambda: email_send(to=to, message=message))))
    if prefs is not None and prefs.webhook_url:
        if webhook_host_allowed(prefs.webhook_url, conf.webhook_hosts):
            outcome = _try(
                lambda: webhook_send(
                    url=prefs.webhook_url,
                    message=message,
                    timeout_s=conf.webhook_timeout_s,
                    allowed_networks=conf.webhook_allowed_networks,
                )
            )
        else:
            outcome = f"webhook host {webhook_host(prefs.webhook_url)} is not allowed"
        results.append((NotificationChannel.WEBHOOK, outcome))
    return results


def _try(send) -> str:
    try:
        send()
    except DeliveryError as exc:
        return str(exc)
    except Exception as exc:  # a misconfigured mail backend: say so on the page, not as a 500
        logger.exception("test notification failed")
        return f"{type(exc).__name__}: {exc}"
    return "sent"
