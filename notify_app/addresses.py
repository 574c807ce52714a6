"""Where a webhook may connect: public addresses only, unless the cluster's allow-list opens a range.

A webhook makes the service POST to a URL a user chose. Without this check any user could make the
worker (and the web process, for the test button) reach loopback, the private network, or a cloud's
metadata service (169.254.169.254). The name is resolved once, every address it resolves to is checked,
and the connection then goes to the address that was checked (senders.webhook_send), so a name that
resolves to a public address when checked and to a private one a moment later (DNS rebinding) cannot
redirect the request.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# socket.getaddrinfo's signature; tests pass their own to stand in for DNS.
Resolver = Callable[..., list]

# What a refusal says: the kind of address, never whether anything listens there.
REFUSED = "its address is loopback, private, link-local or otherwise not public, which webhooks may not reach"


class WebhookAddressRefused(Exception):
    """The webhook's host is, or resolves to, an address webhooks may not reach."""


class WebhookHostUnresolved(Exception):
    """The webhook's host name did not resolve (now)."""


def networks_parse(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """The allow-list setting (CIDRs or single addresses) as networks; a bad entry is a setup error."""
    networks = []
    for value in values:
        value = value.strip()
        if not value:
            continue
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"ATTUNE_NOTIFY_WEBHOOK_ALLOWED_NETWORKS: {value!r} is not an address or a CIDR range"
            ) from exc
    return tuple(networks)


def address_public(address: IPAddress) -> bool:
    """Whether an address is one that webhooks may reach by default: globally routable unicast."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address_public(address.ipv4_mapped)  # ::ffff:127.0.0.1 is loopback
    return not (
        address.is_loopback
        or address.is_link_local
        or address.is_private  # RFC 1918, ULA (fc00::/7), documentation and benchmarking ranges...
        or address.is_unspecified
        or address.is_multicast
        or address.is_reserved
        or not address.is_global  # what is left: shared address space (100.64.0.0/10) and the like
    )


def address_allowed(address: IPAddress, allowed: tuple[IPNetwork, ...]) -> bool:
    """Public, or inside one of the operator's allowed networks."""
    return address_public(address) or any(address in network for network in allowed)


def webhook_address(
    host: str, port: int, allowed: tuple[IPNetwork, ...], *, resolver: Resolver | None = None
) -> str:
    """Resolve `host` once and return the address to connect to (the first the resolver gives).

    Raises WebhookAddressRefused when any of its addresses is not allowed (a name that mixes public and
    private addresses is refused whole: which one a client would use is not ours to guess), and
    WebhookHostUnresolved when it does not resolve.
    """
    try:
        infos = (resolver or socket.getaddrinfo)(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookHostUnresolved(host) from exc
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canonname, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])  # an IPv6 zone is not part of it
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise WebhookHostUnresolved(host)
    if not all(address_allowed(a, allowed) for a in addresses):
        raise WebhookAddressRefused(host)
    return str(addresses[0])


def webhook_url_refused(
    url: str, allowed: tuple[IPNetwork, ...], *, resolver: Resolver | None = None
) -> bool:
    """Whether saving this webhook URL must be refused: its host is, or now resolves to, an address
    webhooks may not reach. A name that does not resolve now is accepted (a DNS hiccup must not block
    saving settings); every send checks again."""
    parts = urlsplit(url)
    if not parts.hostname:
        return False  # the URL validators say what is wrong with it
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    try:
        webhook_address(parts.hostname, port, allowed, resolver=resolver)
    except WebhookAddressRefused:
        return True
    except WebhookHostUnresolved:
        return False
    return False
