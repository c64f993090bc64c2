"""Providers: write-only credentials and the endpoints the server may send to."""

from __future__ import annotations

from collections.abc import Sequence

from stack.registry.crypto import encrypt_secret
from stack.registry.endpoints import endpoint_under, endpoint_url_problem
from stack.registry.models import (
    Provider,
)
from stack.registry.services.errors import RegistryError


def provider_set_credentials(*, provider: Provider, credentials: str | None) -> Provider:
    """Store (encrypted) or clear a provider's credentials. None leaves them as they are."""
    if credentials is None:
        return provider
    provider.credentials_encrypted = encrypt_secret(credentials) if credentials else ""
    provider.save(update_fields=["credentials_encrypted"])
    return provider


def provider_endpoints_allow(
    *, provider: Provider, urls: Sequence[str], private_network: bool | None = None
) -> Provider:
    """An admin's act: let deployments of `provider` use these endpoints (URL prefixes), and
    optionally let the outbound guard reach private networks for it. The demo seed and the
    benchmarks, which register loopback model servers, call this."""
    allowed = list(provider.allowed_endpoints or [])
    for url in urls:
        problem = endpoint_url_problem(url)
        if problem is not None:
            raise RegistryError(f"{url[:100]}: {problem}", field="allowed_endpoints")
        prefixes = [provider.base_url, *allowed] if provider.base_url else allowed
        if not any(endpoint_under(url, prefix) for prefix in prefixes):
            allowed.append(url.rstrip("/"))
    fields = []
    if allowed != list(provider.allowed_endpoints or []):
        provider.allowed_endpoints = allowed
        fields.append("allowed_endpoints")
    if private_network is not None and provider.allow_private_network != private_network:
        provider.allow_private_network = private_network
        fields.append("allow_private_network")
    if fields:
        provider.save(update_fields=fields)
    return provider
