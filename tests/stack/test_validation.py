"""The input checks (registry.validation), and every serializer and form built from them.

Each kind of input has one check; the API's fields and the pages' form fields wrap them, and the
last tests here walk every serializer and form of the project so that a new one cannot read a
number, a time, a currency or a JSON value past them.
"""

from __future__ import annotations

import importlib
import pkgutil
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django import forms
from rest_framework import serializers

from registry import form_fields
from registry.api import fields as api_fields
from registry.validation import (
    BIGINT_MAX,
    InputError,
    config_parse,
    currency_parse,
    date_parse,
    datetime_parse,
    decimal_parse,
    float_parse,
    id_parse,
    int_parse,
    json_parse,
    text_problem,
    yaml_parse,
)

DEEP = 100_000  # far past Python's recursion limit


# --- The checks themselves ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["a\x00b", "tab\x01", "esc\x1b[0m", "del\x7f", "c1\x85", "lone \ud800"])
def test_text_with_nul_control_characters_or_lone_surrogates_is_refused(text: str) -> None:
    problem = text_problem(text)
    assert problem is not None and "U+" in problem


def test_tabs_newlines_and_ordinary_unicode_are_text() -> None:
    assert text_problem("a\tb\r\nçé 日本 😀 ١٢") is None


@pytest.mark.parametrize("text", ["١٢", "²", "１２"])
def test_numbers_are_read_from_ascii_digits_only(text: str) -> None:
    for parse in (int_parse, float_parse):
        with pytest.raises(InputError, match="ASCII"):
            parse(text)
    with pytest.raises(InputError, match="ASCII|not a decimal"):
        decimal_parse(text, max_digits=24, decimal_places=9)
    assert id_parse(text) is None


def test_an_id_is_a_whole_number_from_one_to_bigint() -> None:
    assert id_parse("12") == 12
    assert id_parse(str(BIGINT_MAX)) == BIGINT_MAX
    for bad in (str(BIGINT_MAX + 1), "0", "-3", "1.0", "abc", "", "99999999999999999999999999", True):
        assert id_parse(bad) is None


def test_a_decimal_must_fit_its_column() -> None:
    assert decimal_parse("12.50", max_digits=20, decimal_places=9) == Decimal("12.50")
    with pytest.raises(InputError, match="too large"):
        decimal_parse("1e11", max_digits=20, decimal_places=9)
    with pytest.raises(InputError, match="too large"):
        decimal_parse("1e20", max_digits=12, decimal_places=6)
    with pytest.raises(InputError, match="decimal places"):
        decimal_parse("0.0000001", max_digits=12, decimal_places=6)
    with pytest.raises(InputError, match="finite"):
        decimal_parse("NaN", max_digits=12, decimal_places=6)


@pytest.mark.parametrize(
    "text", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "9999-12-31T00:00:00Z"]
)
def test_a_time_that_does_not_exist_in_utc_or_on_its_last_day_is_refused(text: str) -> None:
    # The last day is left out too: a stored time's day end (day + 1) must still exist.
    with pytest.raises(InputError, match="outside the times that can be stored"):
        datetime_parse(text)
    assert datetime_parse("0001-01-01T00:00:00Z").year == 1
    assert datetime_parse("9999-12-30T23:59:59Z").year == 9999
    with pytest.raises(InputError, match="outside the days"):
        date_parse("9999-12-31")


def test_a_time_is_converted_to_utc_and_needs_an_offset_unless_told() -> None:
    assert datetime_parse("2026-05-01T02:00:00+02:00") == datetime(2026, 5, 1, tzinfo=UTC)
    with pytest.raises(InputError, match="UTC offset"):
        datetime_parse("2026-05-01T00:00:00")
    assert datetime_parse("2026-05-01T00:00:00", naive_is_utc=True) == datetime(2026, 5, 1, tzinfo=UTC)
    with pytest.raises(InputError, match="ISO 8601"):
        datetime_parse("٢٠٢٦-05-01T00:00:00Z")


def test_a_currency_is_an_iso_4217_code() -> None:
    assert currency_parse("usd") == "USD"
    assert currency_parse(" EUR ") == "EUR"
    with pytest.raises(InputError, match="three letters"):
        currency_parse("€€€")
    with pytest.raises(InputError, match="ISO 4217"):
        currency_parse("ABC")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * DEEP + "]" * DEEP, "nested more than"),
        ('{"a": ' * 70 + "1" + "}" * 70, "nested more than 64"),
        ('{"x": NaN}', "not valid JSON"),
        ('{"x": -Infinity}', "not valid JSON"),
        ('{"x": "a\\u0000b"}', "control character"),
        ('{"x": "\\ud800"}', "unpaired surrogate"),
        ('{"x": 1' + "0" * 5000 + "}", "not valid JSON"),
        ("{nope", "not valid JSON"),
    ],
)
def test_json_is_bounded_and_refused_with_a_reason_never_a_recursion_error(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        json_parse(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: .nan\n", "not a finite number"),
        ("a:\n  b: .inf\n", "not a finite number"),
        ("[" * DEEP, "nested more than|not valid YAML"),
        ("- " * 200 + "x\n", "nested more than"),
        ("a: !!binary aGk=\n", "bytes is not a JSON value"),
    ],
)
def test_yaml_is_bounded_json_types_with_finite_numbers(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        yaml_parse(text)


def test_yaml_aliases_that_expand_past_the_bound_are_refused() -> None:
    # A billion laughs: nine levels of ten aliases each.
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        name, below = chr(97 + i), chr(96 + i)
        levels.append(f"{name}: &{name} [{', '.join(['*' + below] * 10)}]")
    with pytest.raises(InputError, match="more than 100000 values"):
        yaml_parse("\n".join(levels) + "\n")


def test_yaml_dates_stay_text_and_json_configs_use_the_json_parser() -> None:
    assert yaml_parse("day: 2026-01-01\npins: {0: a}\n") == {"day": "2026-01-01", "pins": {0: "a"}}
    with pytest.raises(InputError, match="not valid JSON"):
        config_parse('{"a": NaN}')


# --- Every serializer and form is built from the checked fields -------------------------------------------------

PACKAGES = ("stack", "registry", "billing", "training", "inference", "decisions")
PLAIN_DRF = {
    serializers.IntegerField,
    serializers.DecimalField,
    serializers.FloatField,
    serializers.DateTimeField,
    serializers.JSONField,
}
PLAIN_DJANGO = {forms.IntegerField, forms.DecimalField, forms.FloatField, forms.DateTimeField}


def _import_project_modules() -> None:
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if ".migrations" in info.name or ".engine" in info.name or "bench" in info.name:
                continue
            if info.name.endswith((".tests", "management.commands.demo")):
                continue
            importlib.import_module(info.name)


def _subclasses(cls: type) -> list[type]:
    found, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.split(".")[0] in PACKAGES:
                found.append(sub)
    return found


def _walk(fields: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, field in fields.items():
        out.append((f"{prefix}{name}", field))
        if field.read_only:
            continue  # output only: nothing under it reads input
        child = getattr(field, "child", None)
        if child is not None:
            out += _walk({"child": child}, f"{prefix}{name}.")
        if isinstance(field, serializers.BaseSerializer) and hasattr(field, "fields"):
            out += _walk(dict(field.fields), f"{prefix}{name}.")
    return out


@pytest.mark.django_db
def test_every_serializer_reads_numbers_times_currencies_and_json_through_the_checked_fields() -> None:
    _import_project_modules()
    problems = []
    for cls in _subclasses(serializers.Serializer):
        if issubclass(cls, api_fields.ResponseSerializer):
            continue  # documents a response; reads no input
        if issubclass(cls, serializers.ModelSerializer) and not issubclass(cls, api_fields.ModelSerializer):
            problems.append(f"{cls.__module__}.{cls.__name__}: not a registry.api.fields.ModelSerializer")
            continue
        try:
            fields = dict(cls().fields)
        except Exception:  # noqa: BLE001,S112 (a serializer that needs arguments is checked by its users)
            continue
        for name, field in _walk(fields):
            if field.read_only:
                continue
            if type(field) in PLAIN_DRF:
                problems.append(f"{cls.__name__}.{name}: DRF's {type(field).__name__}")
            if name.rsplit(".", 1)[-1] == "currency" and not isinstance(field, api_fields.CurrencyField):
                problems.append(f"{cls.__name__}.{name}: not a CurrencyField")
            if isinstance(field, serializers.DecimalField) and field.max_digits is None:
                problems.append(f"{cls.__name__}.{name}: a decimal without max_digits")
    assert problems == []


def test_every_form_reads_numbers_times_and_currencies_through_the_checked_fields() -> None:
    _import_project_modules()
    problems = []
    for cls in _subclasses(forms.BaseForm):
        for name, field in getattr(cls, "base_fields", {}).items():
            if type(field) in PLAIN_DJANGO:
                problems.append(f"{cls.__name__}.{name}: Django's {type(field).__name__}")
            if name == "currency" and not isinstance(field, form_fields.CurrencyField):
                problems.append(f"{cls.__name__}.{name}: not a CurrencyField")
            if isinstance(field, forms.DecimalField) and field.max_digits is None:
                problems.append(f"{cls.__name__}.{name}: a decimal without max_digits")
    assert problems == []
