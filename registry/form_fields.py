"""Form fields for the pages of every app: numbers in ASCII digits within their column, times
that exist in UTC, ISO 4217 currencies (the checks are registry.validation's).

Django's own IntegerField, DecimalField and FloatField read "١٢" as 12, its DecimalField takes
any number of digits unless told its column's, and its DateTimeField accepts a time (an offset
at the year 1 or 9999) that cannot be converted to UTC when saved. Forms use these instead;
ModelForms get them through `model_formfield` (their Meta's `formfield_callback`).
tests/stack/test_input_validation.py checks that every form of the project does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import models

from registry.validation import BIGINT_MAX, InputError, currency_parse, datetime_utc


def _ascii_digits(value: Any) -> None:
    if isinstance(value, str) and not value.strip().isascii():
        raise ValidationError("write the number in ASCII digits 0-9", code="invalid")


class IntegerField(forms.IntegerField):
    """A whole number in ASCII digits; within a bigint unless given narrower bounds."""

    def __init__(self, *, max_value: int | None = None, min_value: int | None = None, **kwargs: Any) -> None:
        super().__init__(
            max_value=BIGINT_MAX if max_value is None else max_value,
            min_value=-BIGINT_MAX - 1 if min_value is None else min_value,
            **kwargs,
        )

    def to_python(self, value: Any) -> int | None:
        _ascii_digits(value)
        return super().to_python(value)


class DecimalField(forms.DecimalField):
    """A decimal in ASCII digits that fits its column: `max_digits` and `decimal_places` are required."""

    def __init__(self, *, max_digits: int, decimal_places: int, **kwargs: Any) -> None:
        super().__init__(max_digits=max_digits, decimal_places=decimal_places, **kwargs)

    def to_python(self, value: Any) -> Any:  # Decimal | None (the stubs say int)
        _ascii_digits(value)
        return super().to_python(value)


class FloatField(forms.FloatField):
    """A finite number in ASCII digits."""

    def to_python(self, value: Any) -> Any:  # float | None (the stubs say int)
        _ascii_digits(value)
        return super().to_python(value)


class DateTimeField(forms.DateTimeField):
    """A time in ASCII digits (a time without an offset is UTC, the site's zone) that exists in UTC."""

    def to_python(self, value: Any) -> datetime | None:
        if isinstance(value, str) and not value.strip().isascii():
            raise ValidationError("write the time in ASCII digits, e.g. 2026-05-01T00:00:00Z", code="invalid")
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return datetime_utc(parsed, naive_is_utc=True)
        except InputError as exc:
            raise ValidationError(str(exc), code="invalid") from None


class CurrencyField(forms.CharField):
    """An ISO 4217 currency code, upper-cased."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 3)
        kwargs.setdefault("help_text", "ISO 4217 code, e.g. USD")
        super().__init__(**kwargs)

    def clean(self, value: Any) -> str:
        text: str = super().clean(value)
        if text in self.empty_values:
            return text
        try:
            return currency_parse(text)
        except InputError as exc:
            raise ValidationError(str(exc), code="invalid") from None


# Model fields named so hold a currency code; their form field is a CurrencyField.
CURRENCY_FIELD_NAMES = frozenset({"currency"})


def model_formfield(field: models.Field[Any, Any], **kwargs: Any) -> forms.Field | None:
    """The form field for a model field (a ModelForm's Meta.formfield_callback): the checked
    fields above for numbers, times and currencies; URLs without a scheme mean https (Django 6's
    default, chosen explicitly now)."""
    if field.choices:
        return field.formfield(**kwargs)
    if isinstance(field, models.URLField):
        kwargs.setdefault("assume_scheme", "https")
    elif isinstance(field, models.DecimalField):
        kwargs.setdefault("form_class", DecimalField)
    elif isinstance(field, models.DateTimeField):
        kwargs.setdefault("form_class", DateTimeField)
    elif isinstance(field, models.FloatField):
        kwargs.setdefault("form_class", FloatField)
    elif isinstance(field, models.IntegerField):
        kwargs.setdefault("form_class", IntegerField)
    elif isinstance(field, models.CharField) and field.name in CURRENCY_FIELD_NAMES:
        kwargs.setdefault("form_class", CurrencyField)
    return field.formfield(**kwargs)
