"""The registry services' refusal: a DomainError with the field it names."""

from __future__ import annotations

from registry.errors import DomainError, MultiFieldError


class RegistryError(DomainError, ValueError):
    """A registry change that is not allowed; the message is shown to the user."""


class RegistryFieldsError(MultiFieldError, RegistryError):
    """A registry change refused on several fields at once (`errors`: field -> messages)."""
