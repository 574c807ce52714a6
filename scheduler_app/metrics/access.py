"""Who may scrape /metrics: a Bearer token or an allowed address; the only reader of ATTUNE_METRICS_*."""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from enum import Enum

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# With no token and no allow-list, the figures are still there for a Prometheus on the same host (and
# for `curl` on the server), but never for the rest of the network.
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))


class Verdict(Enum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # a token would let it in: 401 with a Bearer challenge
    FORBIDDEN = "forbidden"  # nothing would: 403


@dataclass(frozen=True)
class MetricsAccess:
    """The scrape's credentials: a token (empty: none) and the networks allowed without it."""

    token: str
    networks: tuple[IpNetwork, ...]


def metrics_access() -> MetricsAccess:
    """The settings, parsed; read on every scrape (cheap) so that tests can override them."""
    token = settings.ATTUNE_METRICS_TOKEN or ""
    entries = [entry.strip() for entry in settings.ATTUNE_METRICS_ALLOWED_IPS if entry.strip()]
    try:
        # strict=False: "10.1.2.3/8" means the network 10.0.0.0/8, as most allow-lists read it.
        networks = tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)
    except ValueError as exc:
        raise ImproperlyConfigured(f"ATTUNE_METRICS_ALLOWED_IPS: {exc}") from exc
    if not token and not networks:
        networks = LOOPBACK
    return MetricsAccess(token=token, networks=networks)


def _client_ip(request: HttpRequest) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    # REMOTE_ADDR only: X-Forwarded-For is whatever the client wrote. Behind a reverse proxy every
    # scrape comes from the proxy's address, so use the token there.
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return None
    # An IPv4 client on a dual-stack socket shows as ::ffff:a.b.c.d; match it as the IPv4 address.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _bearer_token(request: HttpRequest) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


def metrics_request_verdict(request: HttpRequest, access: MetricsAccess | None = None) -> Verdict:
    """Allowed when the request carries the configured token or comes from an allowed network."""
    access = access or metrics_access()
    presented = _bearer_token(request)
    # compare_digest takes the same time whatever prefix matches, so the token cannot be guessed
    # a character at a time from response times.
    if (
        access.token
        and presented is not None
        and hmac.compare_digest(presented.encode(), access.token.encode())
    ):
        return Verdict.ALLOWED
    ip = _client_ip(request)
    if ip is not None and any(ip in network for network in access.networks):
        return Verdict.ALLOWED
    return Verdict.UNAUTHENTICATED if access.token else Verdict.FORBIDDEN
