"""Money as text: the ledger's fixed 9 places, and the shorter form people read in messages.

Pure functions, no Django: billing.chain hashes ledger_text, so the ledger's
canonical text, and with it every row hash, depends on it staying as it is.
"""

from __future__ import annotations

from decimal import Decimal

LEDGER_QUANTUM = Decimal("0.000000001")  # the ledger's 9 decimal places (numeric(24, 9))
CENT = Decimal("0.01")


def ledger_text(value: Decimal) -> str:
    """`value` at the ledger's 9 places, fixed-point: "12.500000000", "0.000000000".

    Never exponent notation (str(Decimal("0E-9")) is "0E-9", which some tools
    read as a float), and no negative zero: "-0.000000000" and "0.000000000"
    are one amount.
    """
    value = value.quantize(LEDGER_QUANTUM)
    return format(abs(value) if value.is_zero() else value, "f")


def ledger_text_or_none(value: Decimal | None) -> str | None:
    """ledger_text, with None (no amount, e.g. nothing billed yet) kept as None."""
    return None if value is None else ledger_text(value)


def message_text(value: Decimal) -> str:
    """Cents when that is exact ("12.50"), else every digit ("0.000125"): a message must not round spend away."""
    cents = value.quantize(CENT)
    return str(cents) if cents == value else f"{value.normalize():f}"


def shown_text(value: Decimal) -> str:
    """How pages show an amount: message_text at the ledger's 9 places ("12.50", "0.000125";
    "0.00" for what rounds to nothing there), so a small amount never reads as zero."""
    return message_text(value.quantize(LEDGER_QUANTUM))
