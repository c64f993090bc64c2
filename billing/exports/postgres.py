"""The CSV export written by PostgreSQL itself (COPY ... TO STDOUT), same text as the Python writer."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from django.db import connection

from billing.exports.columns import COLUMNS
from billing.exports.filters import ExportFilters
from billing.focus import PRICING_UNIT, SERVICE_BY_UNIT


def _sql_case(column: str, mapping: Mapping[str, str], default: str) -> str:
    whens = " ".join(f"WHEN '{key}' THEN '{value}'" for key, value in mapping.items())
    return f"CASE {column} {whens} ELSE {default} END"


def _sql_iso(expression: str) -> str:
    """billing.exports.columns.iso_text() in SQL."""
    return f"""to_char(({expression}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def postgres_csv_chunks(filters: ExportFilters) -> Iterator[bytes]:
    """The CSV export, written by PostgreSQL itself (COPY ... TO STDOUT).

    Several times faster than formatting rows in Python, in constant memory:
    the server streams the CSV and we pass its chunks on. Same columns, values
    and order as csv_chunks(export_rows(...)); the text differs only where CSV
    and JSON allow it (PostgreSQL quotes an empty string as "", and writes
    non-ASCII in Tags as itself rather than as \\u escapes).
    """
    period_start = (
        "CASE WHEN u.unit = 'accelerator_hour' "
        "THEN u.occurred_at - make_interval(secs => round(abs(u.quantity) * 3600, 6)) "
        "ELSE u.occurred_at END"
    )
    tags = (
        """'{"subject":' || to_json(u.subject_type || ':' || u.subject_id)::text"""
        """ || ',"team":' || coalesce(to_json(nullif(u.team, ''))::text, 'null')"""
        """ || ',"training_run":' || CASE WHEN u.subject_type = 'training_run'"""
        """ THEN to_json(u.subject_id)::text ELSE 'null' END"""
        """ || ',"workflow":' || coalesce(to_json(w.slug)::text, 'null') || '}'"""
    )
    resource_id = "coalesce(nullif(c.slug, ''), nullif(d.slug, ''), '')"
    resource_type = (
        "CASE WHEN coalesce(c.slug, '') <> '' THEN 'cluster' "
        "WHEN coalesce(d.slug, '') <> '' THEN 'deployment' ELSE '' END"
    )
    expressions = {
        "BilledCost": "u.amount::text",
        "EffectiveCost": "u.amount::text",
        "ListUnitPrice": "u.unit_price::text",
        "PricingQuantity": "u.quantity::text",
        "PricingUnit": _sql_case("u.unit", {k.value: v for k, v in PRICING_UNIT.items()}, "u.unit"),
        "ChargePeriodStart": _sql_iso(period_start),
        "ChargePeriodEnd": _sql_iso("u.occurred_at"),
        "BillingCurrency": "u.currency",
        "ProviderName": "coalesce(nullif(p.display_name, ''), p.slug, '')",
        "ServiceName": _sql_case("u.unit", {k.value: v for k, v in SERVICE_BY_UNIT.items()}, "'Other'"),
        "ResourceId": resource_id,
        "ResourceType": resource_type,
        "Tags": tags,
        "x_UsageRecordId": "u.id",
        "x_Partition": "u.partition",
        "x_Sequence": "u.sequence",
        "x_PriceBookId": "u.price_book_id",
        "x_PriceBookVersion": "pb.version",
        "x_RowHash": "u.row_hash",
        "x_PrevHash": "u.prev_hash",
        "x_Unit": "u.unit",
        "x_IdempotencyKey": "u.idempotency_key",
        "x_ApiKey": "coalesce(k.prefix, '')",
    }
    select = ", ".join(f'{expressions[name]} AS "{name}"' for name in COLUMNS)
    where: list[str] = []
    params: list[object] = []
    for condition, value in (
        ("u.partition = %s", filters.partition),
        ("u.occurred_at >= %s", filters.start),
        ("u.occurred_at < %s", filters.end),
        ("p.slug = %s", filters.provider),
        ("c.slug = %s", filters.cluster),
        ("w.slug = %s", filters.workflow),
        ("u.team = %s", filters.team),
        ("k.prefix = %s", filters.api_key),
        ("u.unit = %s", filters.unit),
    ):
        if value not in (None, ""):
            where.append(condition)
            params.append(value)
    if filters.training_run:
        where.append("u.subject_type = 'training_run' AND u.subject_id = %s")
        params.append(filters.training_run)
    if filters.through is not None:
        # The snapshot: each pinned partition up to its head (no partition pinned: no rows).
        heads = filters.heads()
        where.append(
            "(" + (" OR ".join(["(u.partition = %s AND u.sequence <= %s)"] * len(heads)) or "false") + ")"
        )
        for partition, sequence in heads.items():
            params += [partition, sequence]
    sql = (
        f"COPY (SELECT {select} FROM billing_usagerecord u "  # noqa: S608 (constants; values are bound)
        "JOIN billing_pricebook pb ON pb.id = u.price_book_id "
        "LEFT JOIN stack_provider p ON p.id = u.provider_id "
        "LEFT JOIN stack_cluster c ON c.id = u.cluster_id "
        "LEFT JOIN stack_deployment d ON d.id = u.deployment_id "
        "LEFT JOIN stack_workflow w ON w.id = u.workflow_id "
        "LEFT JOIN stack_apitoken k ON k.id = u.api_key_id "
        f"WHERE {' AND '.join(where) or 'true'} ORDER BY u.occurred_at, u.partition, u.sequence) "
        "TO STDOUT WITH (FORMAT csv, HEADER true)"
    )
    with connection.cursor() as cursor, cursor.cursor.copy(sql, params) as copy:
        for block in copy:
            yield bytes(block)
