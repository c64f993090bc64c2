"""What the create and update services of the registry's objects share: the fields a caller may
set. The serializers, page forms and the Django admin only translate their input into these
fields; the entity's service checks the rules and writes (RegistryError names the field)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db.models import Model

from registry.services.errors import RegistryError

M = TypeVar("M", bound=Model)


def fields_assign(instance: M, fields: Mapping[str, Any], editable: Collection[str]) -> M:
    """Set `fields` on `instance` (unsaved); a name outside `editable` is a programming error."""
    unknown = sorted(set(fields) - set(editable))
    if unknown:
        raise TypeError(f"{type(instance).__name__}: not fields a caller sets: {', '.join(unknown)}")
    for name, value in fields.items():
        setattr(instance, name, value)
    return instance


def rule_validator(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """A service's rule on one field as a form or serializer field validator, so that its
    refusal shows beside the other fields' errors; the service checks again as it writes."""

    def validate(value: Any) -> None:
        try:
            check(value)
        except RegistryError as exc:
            raise ValidationError([m for messages in exc.field_errors().values() for m in messages]) from None

    return validate
