"""http_fetch reaches only public addresses, and connects to the very address it checked.

The tool runs with a :class:`CheckedBackend` built from a scripted resolver and a recording
connector (tests/worker/tools/fetch_server.py): nothing here sends a packet anywhere but
127.0.0.1.
"""

from __future__ import annotations

import ipaddress

import pytest

from fermix_worker.tools.web import CheckedBackend, is_public
from tests.worker.tools.fetch_server import (
    NO_SOCKET,
    PUBLIC,
    RecordingConnector,
    ScriptedResolver,
    Server,
    fetch,
    payload,
)


@pytest.fixture(autouse=True)
def _no_environment_escape_hatches(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("FERMIX_HTTP_FETCH_ALLOW_PRIVATE", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)


def refused(host: str, ip: str) -> str:
    return f"Error: refusing to fetch {host!r}: it resolves to a private or local address ({ip})"


REFUSED = [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
    "100.127.255.254", "0.0.0.0", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1",
    "::ffff:169.254.169.254", "224.0.0.1", "ff02::1", "192.0.2.1", "2002:7f00:1::",
    "64:ff9b::a9fe:a9fe",
]
ALLOWED = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused_before_any_connection(address: str) -> None:
    assert not is_public(address)
    connector = RecordingConnector()
    host = f"[{address}]" if ":" in address else address
    result = fetch(CheckedBackend(ScriptedResolver({}), connector), f"http://{host}/")
    assert result.is_error
    shown = str(ipaddress.ip_address(address))  # as the URL normalizes it: ::ffff:7f00:1
    assert payload(result) == refused(address, shown)
    assert connector.calls == []


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_pass_the_check(address: str) -> None:
    assert is_public(address)
    connector = RecordingConnector()  # refuses: nothing is sent to these addresses
    host = f"[{address}]" if ":" in address else address
    result = fetch(CheckedBackend(ScriptedResolver({}), connector), f"http://{host}/")
    assert connector.calls == [(str(ipaddress.ip_address(address)), 80)]
    assert result.is_error and f"failed: ConnectError: {NO_SOCKET}" in payload(result)


def test_a_name_resolving_to_any_private_address_is_refused() -> None:
    resolver = ScriptedResolver({"mixed.test": [[PUBLIC, "10.0.0.1"]]})
    connector = RecordingConnector()
    result = fetch(CheckedBackend(resolver, connector), "http://mixed.test/")
    assert payload(result) == refused("mixed.test", "10.0.0.1")
    assert connector.calls == []


def test_the_connection_goes_to_the_checked_address_with_the_host_name_kept(
    server: Server,
) -> None:
    resolver = ScriptedResolver({"public.test": [[PUBLIC]]})
    connector = RecordingConnector(local_port=server.server_address[1])
    result = fetch(CheckedBackend(resolver, connector), "http://public.test/page")
    assert not result.is_error
    assert payload(result).endswith("URL: http://public.test/page\nContent-Type: text/plain"
                                    "\n\nserved from the checked address")
    assert connector.calls == [(PUBLIC, 80)]
    assert server.requests == [("/page", "public.test")]


def test_dns_rebinding_cannot_move_the_connection_after_the_check(server: Server) -> None:
    # A public answer for the check, then loopback for whoever asks next (the attack).
    port = server.server_address[1]
    resolver = ScriptedResolver({"rebind.test": [[PUBLIC], ["127.0.0.1"]]})
    connector = RecordingConnector()
    result = fetch(CheckedBackend(resolver, connector), f"http://rebind.test:{port}/secret")
    assert resolver.lookups == ["rebind.test"]  # one lookup, the checked one
    assert connector.calls == [(PUBLIC, port)]
    assert result.is_error and f"failed: ConnectError: {NO_SOCKET}" in payload(result)
    assert server.requests == []  # the loopback service never saw a request


@pytest.mark.parametrize(("path", "host", "ip", "lookups"), [
    ("/to-metadata", "169.254.169.254", "169.254.169.254", ["public.test"]),
    ("/to-internal", "internal.test", "10.0.0.1", ["public.test", "internal.test"]),
])
def test_a_redirect_hop_to_a_private_address_is_refused(
    server: Server, path: str, host: str, ip: str, lookups: list[str]
) -> None:
    resolver = ScriptedResolver({"public.test": [[PUBLIC]], "internal.test": [["10.0.0.1"]]})
    connector = RecordingConnector(local_port=server.server_address[1])
    result = fetch(CheckedBackend(resolver, connector), f"http://public.test{path}")
    assert result.is_error
    assert payload(result) == refused(host, ip)
    assert resolver.lookups == lookups
    assert connector.calls == [(PUBLIC, 80)]  # the first hop only: nothing connected to the target
    assert server.requests == [(path, "public.test")]


def test_an_environment_proxy_cannot_bypass_the_check(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(var, proxy)
    resolver = ScriptedResolver({"public.test": [[PUBLIC]]})
    connector = RecordingConnector()
    result = fetch(CheckedBackend(resolver, connector), "http://public.test/")
    assert connector.calls == [(PUBLIC, 80)]  # our own checked connection, not the proxy's
    assert result.is_error and NO_SOCKET in payload(result)
    assert server.requests == []


def test_allow_private_lifts_the_check_but_still_connects_to_the_resolved_address() -> None:
    resolver = ScriptedResolver({"intranet.test": [["10.0.0.7"], ["10.0.0.8"]]})
    connector = RecordingConnector()
    result = fetch(CheckedBackend(resolver, connector, allow_private=True),
                   "http://intranet.test/")
    assert connector.calls == [("10.0.0.7", 80)]
    assert resolver.lookups == ["intranet.test"]
    assert result.is_error and NO_SOCKET in payload(result)
