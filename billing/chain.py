"""The ledger's hash chain: what is hashed, and how.

Each usage record stores `row_hash = sha256(prev_hash + "\\n" + canonical(fields))`
where `prev_hash` is the row_hash of the previous record of the same partition
(64 zeros for the first). Changing, inserting or removing any row behind the
ORM's back breaks the chain at that row, which `manage.py ledger verify` names.

The canonical form is deliberately simple so that PostgreSQL can reproduce it
in SQL (billing.selectors.ledger_verify checks a million rows there in one
query): the CHAINED_FIELDS in this order, joined by U+001F (unit separator);
NULL as \\N; text with backslash and U+001F escaped; decimals with exactly 9
places and no negative zero; times as UTC `YYYY-MM-DDTHH:MM:SS.ffffffZ`.

Fields added after rows were written (OPTIONAL_CHAINED_FIELDS) are hashed only when set, as
U+001F, the field's tag, "=", its value, after the fixed fields: a row written before the field
existed (or without a value for it) hashes exactly as it did, so old chains still verify, and a
value set on a row is covered (removing it changes the hash).
Pure functions: no Django imports (billing.money is pure too), so the same code
verifies exports offline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from billing.money import ledger_text

GENESIS_HASH = "0" * 64
SEPARATOR = "\x1f"

# The fields a row's hash covers (foreign keys by id), in canonical order.
CHAINED_FIELDS = (
    "partition",
    "sequence",
    "occurred_at",
    "subject_type",
    "subject_id",
    "description",
    "provider_id",
    "cluster_id",
    "deployment_id",
    "model_id",
    "workflow_id",
    "team",
    "quantity",
    "unit",
    "unit_price",
    "amount",
    "currency",
    "price_book_id",
    "reverses_id",
    "idempotency_key",
)


# Added later; hashed only when not NULL (see the module docstring), in this order.
OPTIONAL_CHAINED_FIELDS = ("api_key_id", "cost_avoided")
# The tag each is written with (short: it is in every hashed row that has it).
OPTIONAL_TAGS = {"api_key_id": "k", "cost_avoided": "a"}
ALL_CHAINED_FIELDS = CHAINED_FIELDS + OPTIONAL_CHAINED_FIELDS


def canonical_value(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, Decimal):
        return ledger_text(value)  # 9 places, no exponent, no negative zero
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("ledger times must be timezone-aware")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, str):
        return value.replace("\\", "\\\\").replace(SEPARATOR, "\\x1f")
    if isinstance(value, bool):
        raise TypeError("no boolean is chained")
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"cannot chain a {type(value).__name__}")


def _text(value: str) -> str:
    return value.replace("\\", "\\\\").replace(SEPARATOR, "\\x1f")


def _optional_id(value: int | None) -> str:
    return "\\N" if value is None else str(value)


def _time(value: datetime) -> str:
    return canonical_value(value)


# One converter per CHAINED_FIELDS entry: the hot path of ingest and verify
# (canonical_value gives the same text for the same values, slower).
_SPECIAL: dict[str, Callable[[Any], str]] = {
    "sequence": str,
    "price_book_id": str,
    "occurred_at": _time,
    "quantity": ledger_text,
    "unit_price": ledger_text,
    "amount": ledger_text,
}
_CONVERTERS: tuple[Callable[[Any], str], ...] = tuple(
    _SPECIAL.get(name, _optional_id if name.endswith("_id") and name != "subject_id" else _text)
    for name in CHAINED_FIELDS
)


_FIXED = len(CHAINED_FIELDS)


def canonical_text(values: Sequence[Any]) -> str:
    """The canonical text of a row given its CHAINED_FIELDS values in order, optionally followed
    by its OPTIONAL_CHAINED_FIELDS values (ALL_CHAINED_FIELDS order)."""
    fixed, extra = values[:_FIXED], values[_FIXED:]
    text = SEPARATOR.join([convert(value) for convert, value in zip(_CONVERTERS, fixed, strict=True)])
    for name, value in zip(OPTIONAL_CHAINED_FIELDS, extra, strict=False):
        if value is not None:
            text += f"{SEPARATOR}{OPTIONAL_TAGS[name]}={canonical_value(value)}"
    return text


def chain_hash_values(values: Sequence[Any], prev_hash: str) -> str:
    """row_hash for CHAINED_FIELDS values given in order (then any OPTIONAL_CHAINED_FIELDS)."""
    return hashlib.sha256(f"{prev_hash}\n{canonical_text(values)}".encode()).hexdigest()


def chain_hash(row: Mapping[str, Any], prev_hash: str) -> str:
    """row_hash for a mapping holding (at least) every CHAINED_FIELDS name; an optional field
    missing from it counts as not set."""
    values = [row[name] for name in CHAINED_FIELDS] + [row.get(name) for name in OPTIONAL_CHAINED_FIELDS]
    return chain_hash_values(values, prev_hash)
