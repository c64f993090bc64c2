"""Serializer fields for the API of every app: numbers in ASCII digits within their column, times
that exist in UTC, ISO 4217 currencies, and a serializer that names the fields it does not know.

DRF's IntegerField, DecimalField and FloatField read "١٢" as 12 (Python's int(), Decimal() and
float() do), and its DateTimeField reads times written in such digits. Serializers declare
these classes instead, and `ModelSerializer` maps model fields to them.
tests/stack/test_input_validation.py checks that every serializer of the API does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.db import models
from rest_framework import serializers

from registry.validation import (
    BIGINT_MAX,
    InputError,
    currency_parse,
    datetime_utc,
    document_check,
    float_check,
    json_parse,
)

T = TypeVar("T", bound=models.Model)


def _refuse_other_digits(data: Any) -> None:
    if isinstance(data, str) and not data.strip().isascii():
        raise serializers.ValidationError("write the number in ASCII digits 0-9", code="invalid")


class IntegerField(serializers.IntegerField):
    """A whole number in ASCII digits; within a bigint unless given narrower bounds."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_value", BIGINT_MAX)
        kwargs.setdefault("min_value", -BIGINT_MAX - 1)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        _refuse_other_digits(data)
        return super().to_internal_value(data)


class DecimalField(serializers.DecimalField):
    """A decimal in ASCII digits that fits its column (`max_digits` is required)."""

    def __init__(self, max_digits: int, decimal_places: int, **kwargs: Any) -> None:
        super().__init__(max_digits, decimal_places, **kwargs)

    def to_internal_value(self, data: Any) -> Decimal:
        _refuse_other_digits(data)
        return super().to_internal_value(data)


class FloatField(serializers.FloatField):
    """A finite number in ASCII digits."""

    def to_internal_value(self, data: Any) -> float:
        _refuse_other_digits(data)
        value = super().to_internal_value(data)
        try:
            return float_check(value)
        except InputError as exc:
            raise serializers.ValidationError(str(exc), code="invalid") from None


class DateTimeField(serializers.DateTimeField):
    """A time in ASCII digits within the times that can be stored (registry.validation)."""

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, str) and not value.strip().isascii():
            raise serializers.ValidationError(
                "write the time in ASCII digits, e.g. 2026-05-01T00:00:00Z", code="invalid"
            )
        parsed = super().to_internal_value(value)  # DRF refuses a time that does not exist in UTC
        try:
            return datetime_utc(parsed, naive_is_utc=True)
        except InputError as exc:
            raise serializers.ValidationError(str(exc), code="invalid") from None


class JSONField(serializers.JSONField):
    """Any JSON value, bounded as the API's bodies are: a JSON text sent in a form field is parsed
    by registry.validation.json_parse (DRF's own json.loads would recurse without bound),
    a value from a JSON body was checked by the parser and is checked again, cheaply, here."""

    def to_internal_value(self, data: Any) -> Any:
        try:
            if self.binary or getattr(data, "is_json_string", False):
                text = data.decode() if isinstance(data, bytes) else str(data)
                return json_parse(text)
            document_check(data)
        except InputError as exc:
            where = f"{exc.field}: " if exc.field else ""
            raise serializers.ValidationError(f"{where}{exc}", code="invalid") from None
        return data


class CurrencyField(serializers.CharField):
    """An ISO 4217 currency code; "usd" is read as USD."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 3)
        kwargs.setdefault("help_text", "ISO 4217 currency code, e.g. USD")
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        text = super().to_internal_value(data)
        try:
            return currency_parse(text)
        except InputError as exc:
            raise serializers.ValidationError(str(exc), code="invalid") from None


class ModelSerializer(serializers.ModelSerializer[T]):
    """DRF's ModelSerializer with the fields above for numbers, times and currencies."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.AutoField: IntegerField,
        models.BigAutoField: IntegerField,
        models.BigIntegerField: IntegerField,
        models.IntegerField: IntegerField,
        models.PositiveBigIntegerField: IntegerField,
        models.PositiveIntegerField: IntegerField,
        models.PositiveSmallIntegerField: IntegerField,
        models.SmallAutoField: IntegerField,
        models.SmallIntegerField: IntegerField,
        models.DecimalField: DecimalField,
        models.FloatField: FloatField,
        models.DateTimeField: DateTimeField,
        models.JSONField: JSONField,
    }

    def build_standard_field(
        self, field_name: str, model_field: models.Field[Any, Any]
    ) -> tuple[type[serializers.Field[Any, Any, Any, Any]], dict[str, Any]]:
        field_class, kwargs = super().build_standard_field(field_name, model_field)
        if field_name == "currency" and issubclass(field_class, serializers.CharField):
            field_class = CurrencyField
            kwargs.pop("max_length", None)
            kwargs.pop("allow_blank", None)
        return field_class, kwargs


class RefuseUnknownFields(serializers.Serializer[Any]):
    """Refuses input naming fields the serializer does not have (400 naming each), where
    dropping them silently would do something else than asked (an unfiltered export)."""

    # Sent by the browsable API's forms alongside the fields.
    IGNORED = frozenset({"csrfmiddlewaretoken"})

    def _known(self, key: str) -> bool:
        if key in self.fields or key in self.IGNORED:
            return True
        # A form spells a dict's entries "filters.start" and a list's items "formats[0]", as
        # DRF's DictField and ListField read them (and nothing else: "filters[start]" is unknown).
        name, dot, _ = key.partition(".")
        if dot and isinstance(self.fields.get(name), serializers.DictField | serializers.Serializer):
            return True
        match = re.fullmatch(r"(.+)\[[0-9]+\]", key)
        return match is not None and isinstance(self.fields.get(match.group(1)), serializers.ListField)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(k) for k in data if not self._known(str(k)))
            if unknown:
                expected = ", ".join(name for name, f in self.fields.items() if not f.read_only)
                raise serializers.ValidationError(
                    {name: [f"unknown field; expected {expected}"] for name in unknown}
                )
        return super().to_internal_value(data)


class ResponseSerializer(serializers.Serializer[Any]):
    """The shape of a response body, for the OpenAPI schema only: never used to read input, so
    its fields need none of the checked input fields above."""
