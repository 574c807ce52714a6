"""How a message leaves: email through Django's mail settings, a webhook as an HTTP POST of JSON.

Both raise DeliveryError, which says whether trying again later may help (a refused connection, a
timeout, an HTTP 5xx, an SMTP 4xx) or not (an HTTP 4xx, an SMTP 5xx such as an unknown recipient).
"""

from __future__ import annotations

import logging
import smtplib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.mail import EmailMessage

from notify_app.addresses import (
    REFUSED,
    IPNetwork,
    WebhookAddressRefused,
    WebhookHostUnresolved,
    webhook_address,
)

logger = logging.getLogger(__name__)

USER_AGENT = "Attune-Notify/1"
MAX_ERROR_CHARS = 500
# Every failed connection reads the same (refused, reset, timed out, closed early): see webhook_send.
UNREACHABLE = "the endpoint did not answer or refused the connection"


class DeliveryError(Exception):
    """A send that did not go through; `retryable`: whether a later try may succeed."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message[:MAX_ERROR_CHARS])
        self.retryable = retryable


@dataclass(frozen=True)
class Message:
    """One notification's content: a subject and text for both channels, and the webhook's extra
    JSON fields. `key` identifies it to receivers that deduplicate (Idempotency-Key, Message-ID)."""

    subject: str
    text: str
    key: str
    fields: dict[str, Any] = field(default_factory=dict)

    def webhook_body(self) -> dict[str, Any]:
        # `text` first and as Slack reads it: a Slack incoming-webhook URL works as it is; the other
        # fields are for receivers that want structure (Slack ignores them).
        return {"text": self.text, **self.fields}


def webhook_host(url: str) -> str:
    """The host a webhook URL points at (what errors and logs name: never the path, which may hold a
    secret, as Slack's do)."""
    return (urlsplit(url).hostname or "").lower()


def webhook_host_allowed(url: str, allowed: tuple[str, ...]) -> bool:
    """Whether the URL's host is one of `allowed` or below one of them; an empty tuple allows any."""
    if not allowed:
        return True
    host = webhook_host(url)
    return any(host == a or host.endswith(f".{a}") for a in allowed)


def email_send(*, to: str, message: Message) -> None:
    """Send one email through the configured backend (EMAIL_* settings); raises DeliveryError."""
    email = EmailMessage(
        subject=message.subject,
        body=message.text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[to],
        headers={"X-Attune-Notification": message.key},
    )
    try:
        email.send(fail_silently=False)
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        raise DeliveryError(
            f"recipient refused: {_smtp_detail(exc.recipients)}", retryable=any(400 <= c < 500 for c in codes)
        ) from exc
    except smtplib.SMTPResponseException as exc:
        # 4xx: a transient refusal (greylisting, a full queue); 5xx: permanent (authentication, policy).
        detail = (
            exc.smtp_error.decode(errors="replace") if isinstance(exc.smtp_error, bytes) else exc.smtp_error
        )
        raise DeliveryError(f"SMTP {exc.smtp_code}: {detail}", retryable=400 <= exc.smtp_code < 500) from exc
    except OSError as exc:  # refused connection, timeout, a dropped session (smtplib errors are OSErrors)
        raise DeliveryError(f"SMTP connection failed: {_describe(exc)}", retryable=True) from exc


def webhook_send(
    *, url: str, message: Message, timeout_s: float, allowed_networks: tuple[IPNetwork, ...] = ()
) -> None:
    """POST the message's JSON body to `url`; raises DeliveryError unless it answers 2xx.

    The host is resolved once and must be public or inside `allowed_networks` (notify_app/addresses.py);
    the request then goes to that very address, with the name in the Host header and as the TLS server
    name (the certificate is checked against the name), so DNS cannot point it elsewhere meanwhile. No
    proxy from the environment is used: it would connect on our behalf, and to where it chose.

    Redirects are not followed: a webhook that moved should be updated, and following them would let
    a receiver send the service elsewhere.

    A connection that fails says only that: refused, reset, timed out and closed early read the same,
    so that the errors shown to users never map the ports of a host (the detail goes to the log).
    """
    try:
        target = httpx.URL(url)
        if target.scheme not in ("http", "https") or not target.host:
            raise httpx.UnsupportedProtocol(f"webhooks are http or https URLs, not {target.scheme or 'this'}")
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise DeliveryError(f"invalid webhook URL: {_describe(exc)}", retryable=False) from exc
    host = target.host
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        address = webhook_address(host, port, allowed_networks)
    except WebhookAddressRefused as exc:
        raise DeliveryError(f"webhook {host} refused: {REFUSED}", retryable=False) from exc
    except WebhookHostUnresolved as exc:
        # Read like a failed connection: it is one, and it tells nothing about which names exist inside.
        raise DeliveryError(f"could not deliver to webhook {host}: {UNREACHABLE}", retryable=True) from exc
    extensions = {"sni_hostname": host} if target.scheme == "https" else {}
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
            response = client.post(
                target.copy_with(host=address),
                json=message.webhook_body(),
                headers={
                    "Host": target.netloc.decode("ascii"),
                    "User-Agent": USER_AGENT,
                    "Idempotency-Key": message.key,
                },
                extensions=extensions,
            )
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise DeliveryError(f"invalid webhook URL: {_describe(exc)}", retryable=False) from exc
    except httpx.TransportError as exc:  # refused, reset, timed out, TLS: may work later
        logger.info("webhook %s (%s port %s): %s", host, address, port, _describe(exc))
        raise DeliveryError(f"could not deliver to webhook {host}: {UNREACHABLE}", retryable=True) from exc
    status = response.status_code
    if 200 <= status < 300:
        return
    # Only the status: the body of an arbitrary URL's answer is not the user's to read through us.
    retryable = status >= 500 or status in (408, 429)
    raise DeliveryError(f"webhook {host} answered HTTP {status}", retryable=retryable)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _smtp_detail(recipients: dict[str, tuple[int, bytes]]) -> str:
    return "; ".join(
        f"{code} {msg.decode(errors='replace') if isinstance(msg, bytes) else msg}"
        for code, msg in recipients.values()
    )
