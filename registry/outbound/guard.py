"""The one guard for outbound requests: provider calls, budget webhooks, object-store endpoints.

Every connection Switchyard opens to a URL that a user could have influenced goes through
`guarded_connection` (http.client: the OpenAI-compatible adapter, webhooks) or is checked by
`botocore_guard` (boto3: Bedrock and S3 clients, on every request they send). The guard resolves
the host and refuses the connection when any of its addresses is

- never allowed: unspecified (0.0.0.0, ::), multicast, link-local (169.254/16, fe80::/10, which
  holds the cloud metadata services), reserved ranges, and the known metadata addresses
  (169.254.169.254, 169.254.170.2, fd00:ec2::254, 100.100.100.200);
- allowed only when an admin said so: loopback, private (RFC 1918, fc00::/7), shared address
  space (100.64/10) and every other range that is not globally routable (`ipaddress.is_global`).

"An admin said so" is either the provider's `allow_private_network` flag (the admin-only
provider record; on-premise model servers and the demo's loopback `serve_model`) or a network
listed in `SWITCHYARD_OUTBOUND_ALLOW_NETWORKS` (CIDRs, for every destination: an internal
webhook receiver, a MinIO). A listed network allows every address in it, metadata included.
Addresses embedded in IPv6 (IPv4-mapped, 6to4, Teredo, NAT64) are judged as the IPv4 address too.

DNS rebinding: the connection is made to the address that was checked (the name is resolved once
here, never again by the socket layer), and a decision is cached per (host, port, policy) for
`SWITCHYARD_OUTBOUND_DNS_CACHE_SECONDS` (30), so a kept-alive connection pays nothing and a new
one pays at most one lookup per host and TTL. boto3 resolves names itself: for its clients the
guard checks the request's host before each send (cached alike), which leaves the window of one
lookup; their endpoints are admin settings or AWS's own names. Redirects are never followed:
http.client does not, and neither do our webhook or provider calls.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

logger = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata services: AWS/GCP/Azure/OpenStack/Oracle (169.254.169.254), ECS task metadata,
# AWS's IPv6 IMDS, Alibaba Cloud. The first two are link-local anyway; named so that an
# allow_private_network provider can never reach one.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
REFUSED_MESSAGE = "the outbound policy refuses this destination"


class OutboundRefused(Exception):
    """A destination the policy refuses. `str()` is safe to show; `detail` is for the logs."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(f"{REFUSED_MESSAGE}: {host}")
        self.host = host
        self.detail = detail


@dataclass(frozen=True)
class Policy:
    """What one destination may reach: private ranges (an admin's per-provider flag) or not."""

    allow_private: bool = False


PUBLIC_ONLY = Policy(allow_private=False)
PRIVATE_ALLOWED = Policy(allow_private=True)


def _views(ip: IPAddress) -> list[IPAddress]:
    """The address and every IPv4 address embedded in it."""
    views: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            views.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            views.append(ip.sixtofour)
        if ip.teredo is not None:
            views.extend(ip.teredo)
        if ip in _NAT64:
            views.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return views


def address_refusal(ip: IPAddress, *, policy: Policy, allowed: Iterable[Network] = ()) -> str | None:
    """Why the policy refuses this address, or None when it may be reached."""
    allowed = tuple(allowed)
    if any(ip in net for net in allowed if net.version == ip.version):
        return None
    private = f"{ip} is loopback or private and the destination may not reach private networks"
    for view in _views(ip):
        if view in METADATA_ADDRESSES:
            return f"{view} is a cloud metadata address"
        if view.is_loopback:  # before is_reserved: ::1 lies in the reserved ::/8
            if not policy.allow_private:
                return private
            continue
        if view.is_unspecified or view.is_multicast or view.is_link_local or view.is_reserved:
            return f"{view} is unspecified, multicast, link-local or reserved"
        if not policy.allow_private and (view.is_private or not view.is_global):
            return private
    return None


# --- Settings -------------------------------------------------------------------------------------

_networks_cache: tuple[tuple[str, ...], tuple[Network, ...]] = ((), ())


def allowed_networks() -> tuple[Network, ...]:
    """SWITCHYARD_OUTBOUND_ALLOW_NETWORKS, parsed once per value (settings validate it at start)."""
    global _networks_cache
    raw = tuple(settings.OUTBOUND_ALLOW_NETWORKS)
    if _networks_cache[0] != raw:
        _networks_cache = (raw, tuple(ipaddress.ip_network(n, strict=False) for n in raw))
    return _networks_cache[1]


def _cache_seconds() -> float:
    return settings.OUTBOUND_DNS_CACHE_SECONDS


# --- Resolution -----------------------------------------------------------------------------------

AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]
_decisions: dict[
    tuple[str, int, Policy, tuple[Network, ...]], tuple[float, list[AddrInfo] | OutboundRefused]
] = {}
_lock = threading.Lock()


def resolve(host: str, port: int, *, policy: Policy) -> list[AddrInfo]:
    """The addresses of host:port that may be connected to, or OutboundRefused.

    Refused when any address is refused (a name that mixes public and private answers is how
    rebinding attacks look), and when the name does not resolve. Cached briefly either way.
    """
    networks = allowed_networks()
    key = (host.lower(), port, policy, networks)
    now = time.monotonic()
    cached = _decisions.get(key)
    if cached is not None and cached[0] > now:
        if isinstance(cached[1], OutboundRefused):
            raise cached[1]
        return cached[1]
    decision: list[AddrInfo] | OutboundRefused
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        # Not cached: a name that fails to resolve is a transient failure, not a decision.
        raise OSError(f"cannot resolve {host}: {exc}") from exc
    decision = [info for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    for info in decision:
        # The scope id (fe80::1%eth0) is not part of the address.
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        why = address_refusal(ip, policy=policy, allowed=networks)
        if why is not None:
            decision = OutboundRefused(host, why)
            break
    if isinstance(decision, list) and not decision:
        decision = OutboundRefused(host, "no IPv4 or IPv6 address")
    with _lock:
        if len(_decisions) > 4096:
            _decisions.clear()
        _decisions[key] = (now + _cache_seconds(), decision)
    if isinstance(decision, OutboundRefused):
        logger.warning("outbound refused: %s:%s: %s", host, port, decision.detail)
        raise decision
    return decision


def decisions_clear() -> None:
    """Forget cached decisions (tests; a settings change)."""
    with _lock:
        _decisions.clear()


def check_host(host: str, port: int, *, policy: Policy) -> None:
    """Raise OutboundRefused when host:port may not be reached (resolving it, cached)."""
    resolve(host, port, policy=policy)


def create_connection(
    address: tuple[str, int],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
    *,
    policy: Policy,
) -> socket.socket:
    """socket.create_connection, but only to an address the policy allows: the one checked."""
    host, port = address
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in resolve(host, port, policy=policy):
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not None:
                sock.settimeout(timeout)
            if source_address is not None:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last if last is not None else OSError(f"cannot connect to {host}:{port}")


def guarded_connection(
    scheme: str, host: str, port: int, *, timeout: float, policy: Policy
) -> http.client.HTTPConnection:
    """An http.client connection whose socket is opened by `create_connection` above.

    For https the certificate is still checked against the host name (SNI and verification
    use the name; only the address comes from the guard).
    """
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
    elif scheme == "http":
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        raise OutboundRefused(host, f"scheme {scheme!r} is not http(s)")

    def connect(
        address: tuple[str, int], timeout: float | None = None, source_address: tuple[str, int] | None = None
    ) -> socket.socket:
        return create_connection(address, timeout, source_address, policy=policy)

    # http.client opens its socket through this attribute (HTTPConnection.connect); the
    # HTTPS subclass then wraps that socket in TLS with server_hostname=host.
    conn._create_connection = connect  # type: ignore[attr-defined]
    return conn


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def http_post(
    url: str, *, body: bytes, headers: dict[str, str], timeout: float, policy: Policy, max_body: int = 65536
) -> Answer:
    """One POST through the guard; redirects are answers, never followed. OSError on failure."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OutboundRefused(url[:100], "not an http(s) URL with a host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    conn = guarded_connection(parts.scheme, parts.hostname, port, timeout=timeout, policy=policy)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read(max_body)
        return Answer(status=response.status, body=data)
    except http.client.HTTPException as exc:
        raise OSError(f"HTTP error: {exc}") from exc
    finally:
        conn.close()


def url_literal_refusal(url: str, *, policy: Policy) -> str | None:
    """At entry: why a URL whose host is an IP literal is refused (names are checked on use)."""
    host = urlsplit(url).hostname or ""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    why = address_refusal(ip, policy=policy, allowed=allowed_networks())
    return None if why is None else REFUSED_MESSAGE


def botocore_guard(policy: Policy) -> Callable[..., None]:
    """A botocore `before-send` handler: every request a boto3 client sends is checked first."""

    def before_send(request: Any, **_: Any) -> None:
        parts = urlsplit(request.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            check_host(parts.hostname or "", port, policy=policy)
        except OSError as exc:
            # A name that does not resolve fails as botocore's own lookup would have.
            from botocore.exceptions import EndpointConnectionError  # boto3 users only

            raise EndpointConnectionError(endpoint_url=request.url, error=exc) from exc

    return before_send
