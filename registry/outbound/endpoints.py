"""Where a provider's credentials may go: the endpoints on its (admin-only) record.

A provider's `base_url` and its `allowed_endpoints` are URL prefixes (scheme, host, port and a
path prefix) that an admin wrote. A deployment may name its own `base_url` (a model server's
path, one replica of several) only under one of them, so choosing a deployment never chooses a
new destination for the provider's secret. The rule is checked where a deployment enters (the
API serializer and the model's `clean`, which the page form and the Django admin run) and again
when the router builds its call (`inference.selectors`), so a deployment saved before the rule,
or left outside after an admin narrowed the provider, is refused rather than called.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol
from urllib.parse import urlsplit

# Percent-encoded dot, slash and backslash: a server may decode them into a path that leaves
# the prefix (`/v1/%2e%2e/admin`).
_ENCODED_SEPARATORS = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)


class ProviderEndpoints(Protocol):
    base_url: str
    allowed_endpoints: list[str]


def endpoint_url_problem(url: str) -> str | None:
    """Why `url` cannot be an endpoint or an endpoint prefix, or None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "must be an http:// or https:// URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if port == 0:
        return "must not use port 0"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password (credentials belong on the provider)"
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        return "must not have a query string or fragment"
    if "\\" in url or _ENCODED_SEPARATORS.search(parts.path):
        return "must not contain backslashes or encoded dots and slashes"
    if any(segment in (".", "..") for segment in parts.path.split("/")):
        return "must not contain . or .. path segments"
    return None


def _origin_and_path(url: str) -> tuple[str, str, int, str]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def endpoint_under(url: str, prefix: str) -> bool:
    """Whether `url` lies under `prefix`: same scheme, host and port, and the prefix's path
    as a whole-segment prefix (`/v1` covers `/v1` and `/v1/x`, not `/v10`)."""
    if endpoint_url_problem(url) or endpoint_url_problem(prefix):
        return False
    scheme, host, port, path = _origin_and_path(url)
    p_scheme, p_host, p_port, p_path = _origin_and_path(prefix)
    if (scheme, host, port) != (p_scheme, p_host, p_port):
        return False
    return path == p_path or path.startswith(p_path + "/")


def provider_endpoint_prefixes(provider: ProviderEndpoints) -> list[str]:
    """Every prefix an admin allowed for this provider: its base URL and its allowed endpoints."""
    prefixes = [provider.base_url] if provider.base_url else []
    return prefixes + [e for e in (provider.allowed_endpoints or []) if isinstance(e, str) and e]


def deployment_endpoint_problem(*, provider: ProviderEndpoints, base_url: str) -> str | None:
    """Why a deployment of `provider` may not use `base_url`, or None (an empty one uses the
    provider's own base URL)."""
    if not base_url:
        return None
    problem = endpoint_url_problem(base_url)
    if problem is not None:
        return problem
    prefixes = provider_endpoint_prefixes(provider)
    if any(endpoint_under(base_url, prefix) for prefix in prefixes):
        return None
    if not prefixes:
        return (
            "this provider has no endpoint: an admin sets the provider's base URL or allowed "
            "endpoints, which decide where its credentials may be sent"
        )
    return (
        "must lie under one of the provider's endpoints ("
        + ", ".join(prefixes)
        + "); an admin changes those on the provider"
    )


def endpoint_list_problems(urls: Iterable[str]) -> list[str]:
    """Messages for the entries of an allowed-endpoints list that are not endpoint prefixes."""
    problems = []
    for url in urls:
        problem = endpoint_url_problem(url) if isinstance(url, str) else "must be a URL"
        if problem is not None:
            problems.append(f"{str(url)[:100]}: {problem}")
    return problems
