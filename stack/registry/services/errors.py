"""The registry services' refusal: a DomainError with the field it names."""

from __future__ import annotations

from stack.registry.errors import DomainError


class RegistryError(DomainError, ValueError):
    """A registry change that is not allowed; the message is shown to the user."""
