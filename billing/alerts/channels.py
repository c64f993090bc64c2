"""Saving alert channels: the webhook URL is a trust boundary, checked where it enters.

A channel's URL must be http(s) with a host and no user name or password (Slack and Teams:
https, their URL is their credential), and an IP literal must pass the outbound guard
(names are resolved and checked again on every send, registry.outbound.guard). The URL and the
signed webhook's secret are stored encrypted and never shown again.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from urllib.parse import urlsplit

from billing.models import AlertChannel
from registry.crypto import encrypt_secret
from registry.errors import MultiFieldError
from registry.outbound.guard import PUBLIC_ONLY, allowed_networks, url_literal_refusal

URL_MAX = 2000


class AlertChannelInvalid(MultiFieldError, ValueError):
    """A channel's fields do not fit together; `errors` maps field names to messages."""


def _in_allowed_network(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(ip in network for network in allowed_networks())


def alert_channel_url_problem(*, kind: str, url: str) -> str | None:
    if len(url) > URL_MAX:
        return f"at most {URL_MAX} characters"
    if any(c.isspace() or ord(c) < 32 for c in url):
        return "must not contain spaces or control characters"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if kind in (AlertChannel.Kind.SLACK, AlertChannel.Kind.TEAMS) and parts.scheme != "https":
        # Their URL is their credential: plain HTTP only to a network an admin allowed (a relay
        # inside the site), given as an address.
        if not _in_allowed_network(parts.hostname):
            return "must be an https:// URL (plain http only to an address an admin allowed)"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password"
    if refusal := url_literal_refusal(url, policy=PUBLIC_ONLY):
        return f"{refusal} (an admin may allow its network)"
    return None


def alert_channel_save(*, channel: AlertChannel, url: str | None, secret: str | None) -> AlertChannel:
    """Validate and save a channel. `url` / `secret`: a new value, or None to keep the stored one
    ("" clears the secret). Raises AlertChannelInvalid with field errors."""
    errors: dict[str, list[str]] = defaultdict(list)
    if channel.kind not in AlertChannel.Kind.values:
        errors["kind"].append(f"must be one of: {', '.join(AlertChannel.Kind.values)}")
    if url is None and not channel.url_encrypted:
        errors["url"].append("a channel needs its webhook URL")
    elif url is not None and (problem := alert_channel_url_problem(kind=channel.kind, url=url)):
        errors["url"].append(problem)
    has_secret = bool(secret) if secret is not None else bool(channel.secret_encrypted)
    if channel.kind == AlertChannel.Kind.WEBHOOK and not has_secret:
        errors["secret"].append("a signed webhook needs a secret to sign its requests with")
    if channel.quiet_period_seconds > 7 * 86400:
        errors["quiet_period_seconds"].append("at most a week (604800 seconds)")
    if errors:
        raise AlertChannelInvalid(dict(errors))
    if url is not None:
        channel.url_encrypted = encrypt_secret(url)
        channel.url_host = urlsplit(url).hostname or ""
    if secret is not None:
        channel.secret_encrypted = encrypt_secret(secret) if secret else ""
    channel.save()
    return channel
