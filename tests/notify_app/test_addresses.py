"""Webhooks reach public addresses only (checked after resolving, at save and at send), unless allowed;
the connection goes to the address checked; failures never tell an open port from a closed one."""

from __future__ import annotations

import ipaddress
import socket
import threading

import pytest
from django.test import Client

from notify_app.addresses import address_allowed, networks_parse, webhook_address, webhook_url_refused
from notify_app.models import NotificationSettings
from notify_app.senders import DeliveryError, Message, webhook_send
from tests.notify_app.receivers import HttpReceiver, free_port

MESSAGE = Message(subject="s", text="t", key="k")
FORBIDDEN = [
    "127.0.0.1",  # loopback
    "127.8.9.10",
    "::1",
    "10.1.2.3",  # RFC 1918
    "172.16.0.1",
    "192.168.1.1",
    "169.254.169.254",  # link-local: a cloud's metadata service
    "fe80::1",
    "fc00::1",  # ULA
    "fd12:3456::1",
    "0.0.0.0",  # unspecified
    "::",
    "224.0.0.1",  # multicast
    "ff02::1",
    "240.0.0.1",  # reserved
    "100.64.0.1",  # shared address space (carrier NAT)
    "::ffff:127.0.0.1",  # loopback, IPv4-mapped
    "::ffff:10.0.0.1",
]
PUBLIC = ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"]


def resolving_to(*addresses: str, calls: list[str] | None = None):
    """A stand-in for socket.getaddrinfo: every name resolves to `addresses`."""

    def resolver(host, port, *args, **kwargs):
        if calls is not None:
            calls.append(host)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in addresses
        ]

    return resolver


@pytest.mark.parametrize("address", FORBIDDEN)
def test_internal_addresses_are_refused_by_default(address):
    assert not address_allowed(ipaddress.ip_address(address), ())
    with pytest.raises(DeliveryError, match="not public") as exc:
        webhook_send(
            url=f"http://[{address}]:8080/x" if ":" in address else f"http://{address}/x",
            message=MESSAGE,
            timeout_s=1,
        )
    assert not exc.value.retryable


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address):
    assert address_allowed(ipaddress.ip_address(address), ())


def test_the_allow_list_opens_a_range_and_only_it():
    allowed = networks_parse(["10.0.0.0/8", " 127.0.0.1 ", ""])
    assert address_allowed(ipaddress.ip_address("10.9.8.7"), allowed)
    assert address_allowed(ipaddress.ip_address("127.0.0.1"), allowed)
    assert not address_allowed(ipaddress.ip_address("127.0.0.2"), allowed)
    assert not address_allowed(ipaddress.ip_address("192.168.0.1"), allowed)


def test_a_bad_allow_list_entry_is_a_configuration_error():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="not-a-cidr"):
        networks_parse(["not-a-cidr"])


def test_a_name_is_checked_by_every_address_it_resolves_to():
    from notify_app.addresses import WebhookAddressRefused

    assert webhook_address("hooks.test", 443, (), resolver=resolving_to("93.184.215.14")) == "93.184.215.14"
    with pytest.raises(WebhookAddressRefused):
        webhook_address("hooks.test", 443, (), resolver=resolving_to("93.184.215.14", "10.0.0.5"))
    with pytest.raises(WebhookAddressRefused):  # localhost, really resolved
        webhook_address("localhost", 80, ())


def test_a_name_resolving_to_loopback_is_refused_at_send_and_nothing_is_sent(receiver):
    with pytest.raises(DeliveryError, match="webhook localhost refused") as exc:
        webhook_send(url=f"http://localhost:{receiver.port}/hook", message=MESSAGE, timeout_s=2)
    assert not exc.value.retryable and receiver.requests == []


def test_an_allowed_local_receiver_gets_it(receiver):
    allowed = networks_parse(["127.0.0.0/8"])
    webhook_send(
        url=f"http://localhost:{receiver.port}/hook", message=MESSAGE, timeout_s=5, allowed_networks=allowed
    )
    (got,) = receiver.requests
    assert got.path == "/hook" and got.headers["Host"] == f"localhost:{receiver.port}"


def test_the_connection_goes_to_the_address_checked(receiver, monkeypatch):
    """DNS rebinding: the name resolves once; what it resolves to afterwards does not matter."""
    real_getaddrinfo = socket.getaddrinfo
    names: list[str] = []
    answers = iter([["127.0.0.1"], ["10.66.0.1"], ["10.66.0.1"]])  # checked, then "rebound"

    def rebinding(host, port, *args, **kwargs):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            names.append(host)
            return resolving_to(*next(answers))(host, port)
        return real_getaddrinfo(host, port, *args, **kwargs)  # an address literal (the connection's)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    allowed = networks_parse(["127.0.0.1/32"])
    url = f"http://hooks.test:{receiver.port}/hook"
    webhook_send(url=url, message=MESSAGE, timeout_s=5, allowed_networks=allowed)
    assert names == ["hooks.test"]  # resolved once, by the check; the connection went to its answer
    (got,) = receiver.requests
    assert got.headers["Host"] == f"hooks.test:{receiver.port}"


class HangUp:
    """A TCP server that accepts and closes at once (what the probe saw on :5432, "Server disconnected")."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_errors_do_not_tell_open_ports_from_closed_ones():
    hang_up = HangUp()
    try:
        allowed = networks_parse(["127.0.0.0/8"])
        errors = []
        for port in (hang_up.port, free_port()):  # open (and hangs up), closed (refused)
            with pytest.raises(DeliveryError) as exc:
                webhook_send(
                    url=f"http://127.0.0.1:{port}/", message=MESSAGE, timeout_s=2, allowed_networks=allowed
                )
            errors.append(str(exc.value).replace(str(port), "PORT"))
        assert (
            errors[0]
            == errors[1]
            == "could not deliver to webhook 127.0.0.1: the endpoint did not answer or refused the connection"
        )
        # Not allowed, both are refused before any connection, alike.
        refusals = set()
        for port in (hang_up.port, free_port()):
            with pytest.raises(DeliveryError) as exc:
                webhook_send(url=f"http://127.0.0.1:{port}/", message=MESSAGE, timeout_s=2)
            refusals.add(str(exc.value))
        assert len(refusals) == 1
    finally:
        hang_up.close()


def test_saving_checks_the_address_after_resolving():
    assert webhook_url_refused("http://localhost:8080/x", ())
    assert webhook_url_refused("http://[::1]/x", ())
    assert webhook_url_refused("https://hooks.test/x", (), resolver=resolving_to("192.168.0.10"))
    assert not webhook_url_refused("https://hooks.test/x", (), resolver=resolving_to("93.184.215.14"))
    assert not webhook_url_refused("http://127.0.0.1:9/x", networks_parse(["127.0.0.0/8"]))

    def unresolvable(*args, **kwargs):
        raise socket.gaierror("no such name")

    # A name that does not resolve now is accepted: each send checks again.
    assert not webhook_url_refused("https://hooks.test/x", (), resolver=unresolvable)


@pytest.mark.django_db
def test_the_settings_form_refuses_an_internal_webhook(owner, settings):
    settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "webhook_allowed_networks": []}
    client = Client()
    client.force_login(owner)
    form = {"webhook_url": "http://127.0.0.1:5432/", "on_end": "on"}
    response = client.post("/account/notifications/", form)
    assert response.status_code == 200
    (error,) = response.context["form"].errors["webhook_url"]
    assert "Webhooks may not go to 127.0.0.1" in error and "not public" in error
    assert not NotificationSettings.objects.filter(user=owner, webhook_url__contains="127.0.0.1").exists()
    settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "webhook_allowed_networks": ["127.0.0.0/8"]}
    assert client.post("/account/notifications/", form).status_code == 302


@pytest.mark.django_db
def test_a_saved_webhook_that_now_resolves_inside_is_refused_at_send(owner, settings):
    """Saved while allowed (or while the name was public), sent after: the send checks again."""
    from notify_app.services.settings import notification_test_send
    from tests.notify_app.helpers import opt_in

    receiver = HttpReceiver().start()
    try:
        opt_in(owner, email=False, webhook_url=receiver.url)
        settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "webhook_allowed_networks": []}
        ((channel, outcome),) = notification_test_send(user=owner)
        assert channel == "webhook" and "refused" in outcome and "not public" in outcome
        assert receiver.requests == []
    finally:
        receiver.stop()
