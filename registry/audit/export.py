"""The audit trail as CSV, streamed from a server-side cursor (constant memory)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator

from django.db.models import QuerySet

from registry.audit.models import AuditEntry
from registry.audit.selectors import object_type_of

COLUMNS = [
    "id",
    "timestamp",
    "actor",
    "surface",
    "action",
    "object_type",
    "object_id",
    "object_repr",
    "changes",
]


class _Line:
    """A file-like object csv.writer writes one row into, returned at once."""

    def write(self, value: str) -> str:
        return value


def _cell(value: str) -> str:
    # A cell starting with = + - @ is a formula to a spreadsheet (CSV injection); quote it as text.
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def audit_csv_rows(rows: QuerySet[AuditEntry]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(COLUMNS)
    for entry in rows.iterator(chunk_size=500):
        yield writer.writerow(
            [
                entry.pk,
                entry.timestamp.isoformat(),
                _cell(entry.actor_label),
                entry.surface,
                entry.get_action_display(),
                object_type_of(entry),
                _cell(entry.object_pk),
                _cell(entry.object_repr),
                _cell(json.dumps(entry.changes, sort_keys=True, default=str)),
            ]
        )
