"""Providers: created and changed here only (the API, the page form and the Django admin call
these); write-only credentials and the endpoints the server may send to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from registry.crypto import encrypt_secret
from registry.models import (
    Provider,
)
from registry.outbound.endpoints import endpoint_list_problems, endpoint_under, endpoint_url_problem
from registry.services.errors import RegistryError, RegistryFieldsError
from registry.services.records import fields_assign

# What a caller sets, in the order the page forms show them (registry.forms reads this).
PROVIDER_FIELDS = (
    "slug",
    "display_name",
    "kind",
    "region",
    "base_url",
    "allowed_endpoints",
    "allow_private_network",
    "enabled",
)
MAX_ALLOWED_ENDPOINTS = 50


def provider_base_url_check(base_url: str) -> None:
    """A provider's base URL is an endpoint prefix (registry.outbound.endpoints), or none."""
    if base_url and (problem := endpoint_url_problem(base_url)):
        raise RegistryError(problem, field="base_url")


def provider_endpoints_check(allowed_endpoints: object) -> None:
    """A provider's allowed endpoints are at most 50 endpoint prefixes (one message each)."""
    if not isinstance(allowed_endpoints, list) or len(allowed_endpoints) > MAX_ALLOWED_ENDPOINTS:
        raise RegistryError(
            f"must be a list of at most {MAX_ALLOWED_ENDPOINTS} URLs", field="allowed_endpoints"
        )
    if problems := endpoint_list_problems(allowed_endpoints):
        raise RegistryFieldsError({"allowed_endpoints": problems})


def provider_check(provider: Provider) -> None:
    """A provider's rules, on the state it would be saved with; every refused field is named."""
    errors: dict[str, list[str]] = {}
    for check, value in (
        (provider_base_url_check, provider.base_url),
        (provider_endpoints_check, provider.allowed_endpoints),
    ):
        try:
            check(value)
        except RegistryError as exc:
            errors.update(exc.field_errors())
    if errors:
        raise RegistryFieldsError(errors)


def _provider_save(provider: Provider, credentials: str | None) -> Provider:
    provider_check(provider)
    provider.allowed_endpoints = [url.rstrip("/") for url in provider.allowed_endpoints]
    provider.save()
    return provider_set_credentials(provider=provider, credentials=credentials)


def provider_create(*, credentials: str | None = None, **fields: Any) -> Provider:
    """A new provider of `fields` (PROVIDER_FIELDS) and its credentials (None: none stored)."""
    return _provider_save(fields_assign(Provider(), fields, PROVIDER_FIELDS), credentials)


def provider_update(provider: Provider, *, credentials: str | None = None, **fields: Any) -> Provider:
    """Change the given fields; `credentials`: '' clears them, None keeps them."""
    return _provider_save(fields_assign(provider, fields, PROVIDER_FIELDS), credentials)


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
