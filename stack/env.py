"""Typed readers for environment variables.

Every setting Switchyard reads from the environment goes through one of these
helpers, so that a bad value stops the process at start-up with a message that
names the variable, instead of surfacing later as a confusing runtime error.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """Return the variable as a string; fail loudly when it is unset and has no default."""
    source = os.environ if environ is None else environ
    value = source.get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfigured(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    source = os.environ if environ is None else environ
    raw = source.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false/1/0), got {raw!r}")


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    source = os.environ if environ is None else environ
    raw = source.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_float(
    name: str,
    default: float,
    *,
    minimum: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> float:
    source = os.environ if environ is None else environ
    raw = source.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_decimal(
    name: str,
    default: str,
    *,
    minimum: Decimal | None = None,
    environ: Mapping[str, str] | None = None,
) -> Decimal:
    """A decimal (money: never a float); `default` is its text."""
    raw = env_str(name, default, environ=environ)
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name} must be a decimal number, got {raw!r}") from None
    if not value.is_finite() or (minimum is not None and value < minimum):
        raise ImproperlyConfigured(f"{name} must be a finite decimal >= {minimum}, got {raw!r}")
    return value


def env_url(
    name: str,
    default: str,
    *,
    schemes: tuple[str, ...],
    environ: Mapping[str, str] | None = None,
) -> str:
    """Return a URL whose scheme is one of `schemes`."""
    value = env_str(name, default, environ=environ)
    scheme = urlparse(value).scheme
    if scheme not in schemes:
        allowed = ", ".join(f"{s}://" for s in schemes)
        raise ImproperlyConfigured(f"{name} must start with one of {allowed}; got {value!r}")
    return value


def env_list(name: str, default: list[str], *, environ: Mapping[str, str] | None = None) -> list[str]:
    source = os.environ if environ is None else environ
    raw = source.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str, *, environ: Mapping[str, str] | None = None) -> list[str]:
    """Comma-separated CIDRs (`10.0.0.0/8, fd00::/8, 127.0.0.1`), each checked and normalised."""
    networks = []
    for item in env_list(name, [], environ=environ):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an IP network (CIDR)") from None
    return networks


def env_data_roots(name: str, *, environ: Mapping[str, str] | None = None) -> list[str]:
    """Comma-separated `file:///absolute/dir` and `s3://bucket[/prefix]` roots, normalised
    (no trailing slash, no `.` or `..` segments)."""
    roots = []
    for item in env_list(name, [], environ=environ):
        parsed = urlparse(item)
        segments = parsed.path.split("/")
        if parsed.params or parsed.query or parsed.fragment or "." in segments or ".." in segments:
            raise ImproperlyConfigured(f"{name}: {item!r} must be a plain file:///dir or s3://bucket/prefix")
        if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and parsed.path.startswith("/"):
            roots.append("file://" + (parsed.path.rstrip("/") or "/"))
        elif parsed.scheme == "s3" and parsed.netloc:
            prefix = parsed.path.strip("/")
            roots.append(f"s3://{parsed.netloc}" + (f"/{prefix}" if prefix else ""))
        else:
            raise ImproperlyConfigured(f"{name}: {item!r} must be file:///absolute/dir or s3://bucket/prefix")
    return roots


_LOOPBACK_NAMES = {"localhost"}


def env_secret_key(
    name: str, *, production: bool, var_dir: Path, environ: Mapping[str, str] | None = None
) -> str:
    """The secret key: required in production. A development checkout without one gets its own
    random key, kept under var/ so that credentials encrypted with it stay readable across
    restarts."""
    if production:
        return env_str(name, environ=environ)
    value = env_str(name, "", environ=environ)
    if value:
        return value
    key_file = var_dir / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def env_identity_provider_url(
    name: str, *, allow_loopback_http: bool, environ: Mapping[str, str] | None = None
) -> str:
    """An OpenID provider's issuer or endpoint URL (required): https, or plain http to a loopback
    host when `allow_loopback_http` (development and tests run a provider on 127.0.0.1).

    These URLs are a trust boundary: the token endpoint receives the client secret and the JWKS
    endpoint decides which signatures are believed, so anything but a plain https URL (user
    info in it, a fragment, no host, http to another machine) stops the process at start."""
    value = env_str(name, environ=environ).strip()
    parsed = urlparse(value)
    try:
        host = parsed.hostname or ""
        parsed.port  # noqa: B018 (raises ValueError on a port that is not a number)
    except ValueError:
        raise ImproperlyConfigured(f"{name}: {value!r} is not a URL") from None
    if not host or parsed.username is not None or parsed.password is not None or parsed.fragment:
        raise ImproperlyConfigured(
            f"{name} must be an https:// URL with a host and no user or fragment; got {value!r}"
        )
    if any(ch.isspace() or ord(ch) < 0x20 for ch in value):
        raise ImproperlyConfigured(f"{name} must not contain spaces or control characters")
    if parsed.scheme == "https":
        return value
    if parsed.scheme == "http" and allow_loopback_http and _is_loopback(host):
        return value
    where = (
        "https://, or http:// to a loopback host outside production" if allow_loopback_http else "https://"
    )
    raise ImproperlyConfigured(f"{name} must start with {where}; got {value!r}")
