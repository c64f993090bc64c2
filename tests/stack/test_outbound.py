"""The outbound guard (registry/outbound/guard.py): which addresses it refuses, that it connects to
the address it checked (DNS rebinding), its cache, the admin's allow-list, and the settings."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from registry.outbound import guard as outbound
from registry.outbound.guard import PRIVATE_ALLOWED, PUBLIC_ONLY, OutboundRefused, address_refusal
from stack.env import env_data_roots, env_networks
from tests.capture_server import CaptureServer


@pytest.fixture(autouse=True)
def _fresh_decisions() -> Iterator[None]:
    outbound.decisions_clear()
    yield
    outbound.decisions_clear()


@pytest.fixture
def internal() -> Iterator[CaptureServer]:
    server = CaptureServer().start()
    yield server
    server.stop()


def _ip(text: str) -> Any:
    return ipaddress.ip_address(text)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.1.2.3",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "100.64.0.1",  # shared address space
        "169.254.169.254",
        "169.254.170.2",
        "0.0.0.0",  # noqa: S104 (an address judged, never bound)
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd00:ec2::254",
        "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "2002:7f00:1::1",  # 6to4 around 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 around 169.254.169.254
    ],
)
def test_a_destination_that_may_not_reach_private_networks_is_refused_every_non_public_address(
    address: str,
) -> None:
    assert address_refusal(_ip(address), policy=PUBLIC_ONLY) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_refusal(_ip(address), policy=PUBLIC_ONLY) is None


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.0.10", "fd12::5", "::1", "100.64.1.1"])
def test_a_provider_allowed_private_networks_reaches_loopback_and_private_addresses(address: str) -> None:
    assert address_refusal(_ip(address), policy=PRIVATE_ALLOWED) is None


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "100.100.100.200",
        "fe80::1",
        "0.0.0.0",  # noqa: S104 (an address judged, never bound)
        "224.0.0.1",
    ],
)
def test_metadata_link_local_unspecified_and_multicast_stay_refused_even_for_private_providers(
    address: str,
) -> None:
    assert address_refusal(_ip(address), policy=PRIVATE_ALLOWED) is not None


def test_an_admin_listed_network_is_allowed_for_every_destination() -> None:
    listed = [ipaddress.ip_network("10.20.0.0/16")]
    assert address_refusal(_ip("10.20.3.4"), policy=PUBLIC_ONLY, allowed=listed) is None
    assert address_refusal(_ip("10.21.3.4"), policy=PUBLIC_ONLY, allowed=listed) is not None


def test_a_name_is_resolved_and_refused_when_it_leads_to_loopback() -> None:
    with pytest.raises(OutboundRefused) as refused:
        outbound.check_host("localhost", 80, policy=PUBLIC_ONLY)
    assert str(refused.value) == "the outbound policy refuses this destination: localhost"
    assert "127.0.0.1" in refused.value.detail or "::1" in refused.value.detail


def test_literal_forms_of_loopback_are_refused_after_resolution() -> None:
    # getaddrinfo reads these as 127.0.0.1; the guard judges what they resolve to.
    for host in ("2130706433", "0x7f.1", "127.1"):
        with pytest.raises(OutboundRefused):
            outbound.check_host(host, 80, policy=PUBLIC_ONLY)


def test_the_connection_goes_to_the_address_that_was_checked_not_to_a_second_answer(
    internal: CaptureServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebinding resolver answers the checked address first and the metadata address after.
    The guard resolves once (cached) and connects to what it checked; after the cache expires
    the new answer is checked, and refused, before any connection is made."""
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1", "169.254.169.254"])
    lookups: list[str] = []

    def rebinding(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        address = next(answers)
        lookups.append(address)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    for _ in range(2):
        conn = outbound.guarded_connection(
            "http", "rebind.test", internal.port, timeout=5, policy=PRIVATE_ALLOWED
        )
        conn.request("GET", "/x")
        assert conn.getresponse().status == 200
        conn.close()
    assert lookups == ["127.0.0.1"]  # one lookup, two connections, both to the checked address
    assert len(internal.seen) == 2

    outbound.decisions_clear()  # the TTL passed
    conn = outbound.guarded_connection(
        "http", "rebind.test", internal.port, timeout=5, policy=PRIVATE_ALLOWED
    )
    with pytest.raises(OutboundRefused):
        conn.connect()
    assert lookups == ["127.0.0.1", "169.254.169.254"]


def test_a_decision_is_cached_per_host_port_and_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    real = socket.getaddrinfo

    def counting(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append((host, port))
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    for _ in range(3):
        outbound.check_host("127.0.0.1", 8100, policy=PRIVATE_ALLOWED)
    with pytest.raises(OutboundRefused):
        outbound.check_host("127.0.0.1", 8100, policy=PUBLIC_ONLY)
    with pytest.raises(OutboundRefused):
        outbound.check_host("127.0.0.1", 8100, policy=PUBLIC_ONLY)
    assert calls == [("127.0.0.1", 8100), ("127.0.0.1", 8100)]


def test_a_post_through_the_guard_never_follows_a_redirect(internal: CaptureServer, settings: Any) -> None:
    settings.OUTBOUND_ALLOW_NETWORKS = ["127.0.0.1/32"]
    target = CaptureServer(host="127.0.0.2").start()
    try:
        internal.status = 307
        internal.headers = {"Location": f"{target.url}/steal"}
        answer = outbound.http_post(
            f"{internal.url}/hook", body=b"{}", headers={}, timeout=5, policy=PUBLIC_ONLY
        )
        assert answer.status == 307
        assert len(internal.seen) == 1 and target.seen == []
    finally:
        target.stop()


def test_the_allow_list_setting_reads_cidrs_and_refuses_anything_else() -> None:
    assert env_networks("N", environ={"N": "10.0.0.0/8, 127.0.0.1, fd00::/8"}) == [
        "10.0.0.0/8",
        "127.0.0.1/32",
        "fd00::/8",
    ]
    with pytest.raises(ImproperlyConfigured, match="N: 'intranet' is not an IP network"):
        env_networks("N", environ={"N": "intranet"})


def test_the_training_data_roots_setting_takes_absolute_file_dirs_and_s3_prefixes() -> None:
    roots = env_data_roots("R", environ={"R": "file:///srv/data/, s3://bucket/corpora/"})
    assert roots == ["file:///srv/data", "s3://bucket/corpora"]
    for bad in ("file://relative/dir", "/srv/data", "s3://", "file:///srv/../etc", "http://x/y"):
        with pytest.raises(ImproperlyConfigured, match="R: "):
            env_data_roots("R", environ={"R": bad})


def test_every_object_store_request_passes_the_guard(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 endpoint is an admin's setting, so it may be private (MinIO, moto on loopback: the
    other object-store tests), never a metadata address."""
    from registry.store.objectstore import default_store

    for key, value in (
        ("AWS_ACCESS_KEY_ID", "k"),
        ("AWS_SECRET_ACCESS_KEY", "s"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(key, value)
    settings.OBJECT_STORE_URL = "s3://bucket/prefix"
    settings.OBJECT_STORE_ENDPOINT_URL = "http://169.254.169.254:80"
    with pytest.raises(OutboundRefused):
        default_store().get("runs/1/x")


def _self_signed(tmp_path: Any, name: str) -> tuple[str, str]:
    """A certificate for `name` and its key, as PEM files (cryptography, already a dependency)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(cert_path), str(key_path)


def test_https_through_the_guard_still_verifies_the_certificate_against_the_host_name(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The socket goes to the checked address; TLS still sends the name (SNI) and verifies the
    certificate against it: a trusted certificate for another name is refused."""
    import ssl

    cert, key = _self_signed(tmp_path, "provider.test")
    server = CaptureServer().start()
    assert server._server is not None
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    server._server.socket = server_context.wrap_socket(server._server.socket, server_side=True)
    real = socket.getaddrinfo

    def names(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("provider.test", "other.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", names)
    try:
        untrusted = outbound.guarded_connection(
            "https", "provider.test", server.port, timeout=5, policy=PRIVATE_ALLOWED
        )
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusted.connect()

        original = ssl.create_default_context

        def trusting() -> ssl.SSLContext:
            return original(cafile=cert)

        monkeypatch.setattr(ssl, "create_default_context", trusting)
        conn = outbound.guarded_connection(
            "https", "provider.test", server.port, timeout=5, policy=PRIVATE_ALLOWED
        )
        conn.request("POST", "/v1/chat/completions", body=b"{}")
        assert conn.getresponse().status == 200
        conn.close()
        assert server.seen[-1].headers["Host"].startswith("provider.test")
        wrong = outbound.guarded_connection(
            "https", "other.test", server.port, timeout=5, policy=PRIVATE_ALLOWED
        )
        with pytest.raises(ssl.SSLCertVerificationError, match="other.test"):
            wrong.connect()
    finally:
        server.stop()
