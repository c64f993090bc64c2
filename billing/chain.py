"""The ledger's hash chain: what is hashed, and how.

Each usage record stores `row_hash = sha256(prev_hash + "\\n" + canonical(fields))`
where `prev_hash` is the row_hash of the previous record of the same partition
(64 zeros for the first). Changing, inserting or removing any row behind the
ORM's back breaks the chain at that row, which `manage.py ledger verify` names.
Pure functions: no Django imports, so the same code verifies exports offline.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

GENESIS_HASH = "0" * 64
_QUANTUM = Decimal("0.000000001")  # the ledger's 9 decimal places

# The fields a row's hash covers (foreign keys by id), in no particular order:
# the canonical form sorts keys.
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


def _canonical_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        # Databases return 1.1, 1.100000000 or 1.1E+0 for the same number.
        return format(value.quantize(_QUANTUM), "f")
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("ledger times must be timezone-aware")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


def canonical_bytes(values: Mapping[str, Any]) -> bytes:
    """The exact bytes hashed for a row: sorted-key JSON of CHAINED_FIELDS."""
    body = {name: _canonical_value(values[name]) for name in CHAINED_FIELDS}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def chain_hash(values: Mapping[str, Any], prev_hash: str) -> str:
    digest = hashlib.sha256()
    digest.update(prev_hash.encode())
    digest.update(b"\n")
    digest.update(canonical_bytes(values))
    return digest.hexdigest()
