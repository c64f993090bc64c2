"""Money as text: the ledger's 9 places feed the hash chain, so they must never change."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing.chain import CHAINED_FIELDS, canonical_text, canonical_value, chain_hash
from billing.money import ledger_text, ledger_text_or_none, message_text
from billing.templatetags.money import money

EDGE_VALUES = [
    "0",
    "-0",
    "0E-9",
    "-0E-9",
    "0E+3",
    "-0.000000000",
    "1E+3",
    "1E-9",
    "-1E-9",
    "12.5",
    "-12.5",
    "-0.000000001",
    "0.0000000004",  # rounds to zero: must come out as "0.000000000"
    "-0.0000000004",  # rounds to negative zero
    "0.0000000005",  # half-even: rounds to 0
    "0.0000000015",  # half-even: rounds to 2E-9
    "123456789012345.123456789",  # numeric(24, 9) at full width
    "-123456789012345.123456789",
    "0.1",
    "100",
    "2.500000000",
    "3.14159265358979",
]


def _old_chain_decimal(value: Decimal) -> str:
    """billing.chain._decimal as it was before billing.money existed (the chain's reference text)."""
    value = value.quantize(Decimal("0.000000001"))
    return format(abs(value) if value.is_zero() else value, "f")


def _old_canonical_decimal(value: Decimal) -> str:
    """billing.chain.canonical_value's Decimal branch as it was before billing.money existed."""
    value = value.quantize(Decimal("0.000000001"))
    if value.is_zero():
        value = abs(value)
    return format(value, "f")


@pytest.mark.parametrize("text", EDGE_VALUES)
def test_the_chain_text_of_a_decimal_is_byte_identical_to_what_it_was(text: str) -> None:
    value = Decimal(text)
    assert ledger_text(value) == _old_chain_decimal(value) == _old_canonical_decimal(value)
    assert canonical_value(value) == _old_canonical_decimal(value)


def test_ledger_text_is_fixed_point_at_nine_places_without_negative_zero() -> None:
    assert ledger_text(Decimal("0")) == "0.000000000"
    assert ledger_text(Decimal("-0")) == "0.000000000"
    assert ledger_text(Decimal("0E-9")) == "0.000000000"
    assert ledger_text(Decimal("1E+3")) == "1000.000000000"
    assert ledger_text(Decimal("12.5")) == "12.500000000"
    assert ledger_text(Decimal("-0.000000001")) == "-0.000000001"
    assert ledger_text_or_none(None) is None
    assert ledger_text_or_none(Decimal("1E-9")) == "0.000000001"


def test_a_row_hash_is_unchanged_for_a_known_row() -> None:
    """A fixed row and its hash, computed before billing.money: the chain of every ledger depends on it."""
    row = dict.fromkeys(CHAINED_FIELDS)
    row.update(
        partition="main",
        sequence=7,
        occurred_at=datetime(2026, 5, 1, 12, 30, 0, 123456, tzinfo=UTC),
        subject_type="training_run",
        subject_id="42",
        description="a\\b\x1fc",
        cluster_id=3,
        team="",
        quantity=Decimal("-0E-9"),
        unit="accelerator_hour",
        unit_price=Decimal("1E+3"),
        amount=Decimal("12.5"),
        currency="USD",
        price_book_id=9,
        idempotency_key="k",
    )
    text = canonical_text([row[name] for name in CHAINED_FIELDS])
    assert "\x1f0.000000000\x1f" in text and "1000.000000000" in text and "12.500000000" in text
    assert chain_hash(row, "0" * 64) == "d93306f3dbac919b9a029e4d646bf39c1891518732fecc4e22a5601b6ba166f2"


def test_message_text_shows_cents_when_exact_and_every_digit_otherwise() -> None:
    assert message_text(Decimal("12.5")) == "12.50"
    assert message_text(Decimal("12.500000000")) == "12.50"
    assert message_text(Decimal("0.000125000")) == "0.000125"
    assert message_text(Decimal("0E-9")) == "0.00"
    assert message_text(Decimal("1E+3")) == "1000.00"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (Decimal("12.5"), "12.50"),
        (Decimal("0.004"), "0.004"),
        (Decimal("0.000125000"), "0.000125"),
        (Decimal("0E-9"), "0.00"),
        (Decimal("-0.000000001"), "-0.000000001"),
        (Decimal("0.0000000004"), "0.00"),  # below the ledger's 9 places
        (Decimal("1E+3"), "1000.00"),
        (0.25, "0.25"),
        ("0.0031", "0.0031"),
        (None, "\u2014"),
        ("not money", "\u2014"),
    ],
)
def test_pages_show_money_in_cents_or_every_digit_the_ledger_keeps(value: object, shown: str) -> None:
    assert money(value) == shown
