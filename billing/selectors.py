"""Reads from price books and the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import Max, Q, QuerySet, Sum

from billing.chain import (
    ALL_CHAINED_FIELDS,
    CHAINED_FIELDS,
    GENESIS_HASH,
    OPTIONAL_CHAINED_FIELDS,
    OPTIONAL_TAGS,
    chain_hash_values,
)
from billing.models import (
    LEDGER_PARTITION,
    Budget,
    DailyRollup,
    LedgerHead,
    PriceBook,
    Unit,
    UsageRecord,
)
from billing.rollups import unfolded_rows, with_rollup_dimensions
from registry.auth.teams import team_slugs
from registry.models import Cluster, Deployment, Provider


class PriceResolver:
    """Finds the price version in force for usage; caches each target's versions.

    One lookup (`price_in_force`) or a whole batch of ledger writes share this
    logic: the target-specific price (cluster, else deployment) wins over a
    provider-wide one; among a target's versions, the newest effective_from at
    or before the usage time wins, unless it has ended (effective_to).
    """

    def __init__(self) -> None:
        self._versions: dict[tuple[str, str, int | None], list[PriceBook]] = {}

    def _for(self, unit: str, field: str, target_id: int | None) -> list[PriceBook]:
        key = (unit, field, target_id)
        if key not in self._versions:
            rows = PriceBook.objects.filter(unit=unit, **{field: target_id})
            if field == "provider_id":
                rows = rows.filter(cluster__isnull=True, deployment__isnull=True)
            self._versions[key] = list(rows.order_by("-effective_from", "-version"))
        return self._versions[key]

    @staticmethod
    def _pick(versions: list[PriceBook], at: datetime) -> PriceBook | None:
        for version in versions:
            if version.effective_from <= at:
                if version.effective_to is not None and at >= version.effective_to:
                    return None
                return version
        return None

    def resolve(
        self,
        *,
        unit: Unit | str,
        at: datetime,
        cluster_id: int | None = None,
        deployment_id: int | None = None,
        provider_id: int | None = None,
    ) -> PriceBook | None:
        for field, target_id in (
            ("cluster_id", cluster_id),
            ("deployment_id", deployment_id),
            ("provider_id", provider_id),
        ):
            if target_id is not None:
                found = self._pick(self._for(str(unit), field, target_id), at)
                if found is not None:
                    return found
        return None


def price_in_force(
    *,
    unit: Unit | str,
    at: datetime,
    cluster: Cluster | None = None,
    deployment: Deployment | None = None,
    provider: Provider | None = None,
) -> PriceBook | None:
    """The price version in force at `at` (see PriceResolver for the rules)."""
    return PriceResolver().resolve(
        unit=unit,
        at=at,
        cluster_id=cluster.pk if cluster is not None else None,
        deployment_id=deployment.pk if deployment is not None else None,
        provider_id=provider.pk if provider is not None else None,
    )


def price_book_next_version(
    *,
    unit: Unit | str,
    cluster: Cluster | None = None,
    deployment: Deployment | None = None,
    provider: Provider | None = None,
) -> int:
    """The version number the next price for this (target, unit) gets."""
    if cluster is not None or deployment is not None:
        provider = None  # provider-wide prices are those with no narrower target
    latest = PriceBook.objects.filter(
        cluster=cluster, deployment=deployment, provider=provider, unit=unit
    ).aggregate(m=Max("version"))["m"]
    return (latest or 0) + 1


# What a unit of spend is for: the dashboard's training versus inference split, and the
# ledger page's purpose filter.
PURPOSE_BY_UNIT = {
    Unit.ACCELERATOR_HOUR: "training and compute",
    Unit.INPUT_TOKENS_1M: "inference",
    Unit.OUTPUT_TOKENS_1M: "inference",
    Unit.CACHED_INPUT_TOKENS_1M: "inference",
    Unit.CACHE_WRITE_TOKENS_1M: "inference",
    Unit.REASONING_TOKENS_1M: "inference",
    Unit.BATCH_INPUT_TOKENS_1M: "inference",
    Unit.BATCH_OUTPUT_TOKENS_1M: "inference",
    Unit.REQUEST: "inference",
    Unit.STORAGE_GB_MONTH: "storage and transfer",
    Unit.EGRESS_GB: "storage and transfer",
}


def budgets_of_teams(*, teams: frozenset[int] | None) -> QuerySet[Budget]:
    """The budgets of `teams` (team ids; None: every budget): team budgets naming one of their
    slugs and budgets of their workflows. Provider, cluster and run budgets are the platform's."""
    rows = Budget.objects.select_related("workflow", "provider", "cluster")
    if teams is None:
        return rows
    return rows.filter(
        Q(scope=Budget.Scope.TEAM, team__in=team_slugs(teams) or [])
        | Q(scope=Budget.Scope.WORKFLOW, workflow__team__in=teams)
    )


@dataclass(frozen=True)
class DailySpend:
    day: date
    provider: str
    currency: str
    amount: Decimal


# Dimensions spend can be grouped by: the same names on DailyRollup and on the
# annotated ledger tail.
SPEND_DIMENSIONS = frozenset(
    {"day", "provider__slug", "cluster__slug", "deployment__slug", "deployment_id", "workflow__slug", "training_run_id",
     "team", "unit", "currency", "api_key_id", "api_key__prefix"}
)  # fmt: skip


def spend_grouped(
    *,
    by: Sequence[str],
    since_day: date,
    until_day: date | None = None,
    measure: str = "amount",
    teams: frozenset[str] | None = None,
    **filters: Any,
) -> dict[tuple[Any, ...], Decimal]:
    """Exact spend summed per `by` (e.g. ("workflow__slug", "currency")) over UTC days.

    Reads the daily rollups plus the ledger rows not folded into them yet (the
    tail after each partition's rollup watermark, small), so it stays fast on a large ledger
    and still shows a job billed a second ago. `filters` apply to both (names
    from SPEND_DIMENSIONS, e.g. provider__slug="aws"). `measure` is "amount"
    (money) or "quantity" (units used). `teams` (team slugs) keeps only those teams' spend;
    None: every team's and the platform's.
    """
    if measure not in ("amount", "quantity"):
        raise ValueError(f"cannot sum {measure!r}")
    unknown = (set(by) | set(filters)) - SPEND_DIMENSIONS
    if unknown:
        raise ValueError(f"cannot group spend by {sorted(unknown)}")
    rollups = DailyRollup.objects.filter(day__gte=since_day, **filters)
    # Every partition's tail after its own watermark.
    tail = with_rollup_dimensions(
        UsageRecord.objects.filter(unfolded_rows()).filter(
            occurred_at__gte=datetime.combine(since_day, time.min, tzinfo=UTC)
        )
    ).filter(**filters)
    if teams is not None:
        rollups, tail = rollups.filter(team__in=teams), tail.filter(team__in=teams)
    if until_day is not None:
        rollups = rollups.filter(day__lt=until_day)
        tail = tail.filter(occurred_at__lt=datetime.combine(until_day, time.min, tzinfo=UTC))
    totals: dict[tuple[Any, ...], Decimal] = {}
    for rows in (rollups, tail):
        for row in rows.values(*by).annotate(total=Sum(measure)).order_by():
            key = tuple(row[name] for name in by)
            totals[key] = totals.get(key, Decimal("0")) + row["total"]
    return totals


def spend_per_provider_per_day(
    *, since_day: date, until_day: date | None = None, teams: frozenset[str] | None = None
) -> list[DailySpend]:
    """Exact spend per (UTC day, provider, currency) from since_day up to until_day (exclusive),
    of `teams` (slugs) only unless None."""
    totals = spend_grouped(
        by=("day", "provider__slug", "currency"), since_day=since_day, until_day=until_day, teams=teams
    )
    return [
        DailySpend(day=day, provider=provider or "(none)", currency=currency, amount=amount)
        for (day, provider, currency), amount in sorted(
            totals.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])
        )
    ]


def spend_total(*, subject_type: str | None = None, subject_id: str | None = None) -> Decimal:
    rows = UsageRecord.objects.all()
    if subject_type is not None:
        rows = rows.filter(subject_type=subject_type)
    if subject_id is not None:
        rows = rows.filter(subject_id=subject_id)
    return rows.aggregate(total=Sum("amount"))["total"] or Decimal("0")


def usage_for_subject(*, subject_type: str, subject_id: str) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.filter(subject_type=subject_type, subject_id=subject_id).select_related(
        "price_book", "cluster"
    )


@dataclass(frozen=True)
class LedgerVerification:
    partition: str
    rows_checked: int
    ok: bool
    first_bad_id: int | None = None
    first_bad_sequence: int | None = None
    problem: str = ""


_TEXT = {
    "partition",
    "subject_type",
    "subject_id",
    "description",
    "team",
    "unit",
    "currency",
    "idempotency_key",
}
_NULLABLE_IDS = {"provider_id", "cluster_id", "deployment_id", "model_id", "workflow_id", "reverses_id"}


def _sql_canonical(field: str) -> str:
    """billing.chain.canonical_value, written in PostgreSQL."""
    if field in _TEXT:
        return f"replace(replace({field}, '\\', '\\\\'), chr(31), '\\x1f')"
    if field in _NULLABLE_IDS:
        return f"coalesce({field}::text, '\\N')"
    if field == "occurred_at":
        return """to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
    return f"{field}::text"  # sequence, price_book_id, and numeric(24, 9) amounts (9 places)


def _verify_in_postgres(partition: str) -> tuple[int, tuple[int, int, int, str] | None, str]:
    """(rows, the first bad row as (id, sequence, position, kind) or None, the last row hash)."""
    canonical = " || chr(31) || ".join(_sql_canonical(f) for f in CHAINED_FIELDS)
    for name in OPTIONAL_CHAINED_FIELDS:  # billing.chain: only when set, tagged (ids only so far)
        canonical += f" || coalesce(chr(31) || '{OPTIONAL_TAGS[name]}=' || {name}::text, '')"
    sql = f"""
        WITH chain AS (
            SELECT id, sequence, prev_hash, row_hash,
                   lag(row_hash) OVER w AS prev_actual,
                   row_number() OVER w AS position,
                   encode(sha256(convert_to(prev_hash || chr(10) || {canonical}, 'UTF8')), 'hex') AS recomputed
            FROM billing_usagerecord
            WHERE partition = %s
            WINDOW w AS (ORDER BY sequence)
        )
        SELECT id, sequence, position,
               CASE WHEN sequence <> position THEN 'gap'
                    WHEN prev_hash <> coalesce(prev_actual, %s) THEN 'link'
                    ELSE 'changed' END
        FROM chain
        WHERE sequence <> position OR prev_hash <> coalesce(prev_actual, %s) OR recomputed <> row_hash
        ORDER BY sequence
        LIMIT 1
    """  # noqa: S608 (the interpolated parts are this module's own constants)
    with connection.cursor() as cursor:
        cursor.execute(sql, [partition, GENESIS_HASH, GENESIS_HASH])
        bad = cursor.fetchone()
        cursor.execute(
            "SELECT count(*), (SELECT row_hash FROM billing_usagerecord WHERE partition = %s "
            "ORDER BY sequence DESC LIMIT 1) FROM billing_usagerecord WHERE partition = %s",
            [partition, partition],
        )
        count, last_hash = cursor.fetchone()
    return count, bad, last_hash or GENESIS_HASH


def ledger_verify(
    *, partition: str = LEDGER_PARTITION, method: str = "auto", chunk_size: int = 5000
) -> LedgerVerification:
    """Walk a partition's hash chain; report the first row that does not match.

    Catches a row changed behind the ORM's back (its hash no longer matches its
    fields), a deleted row (a gap in the sequence), an inserted or re-linked
    row (prev_hash does not match the row before) and a chain cut short (the
    head says more rows were written than exist). On PostgreSQL the hashes are
    recomputed by the database in one pass (method "sql"); elsewhere, or with
    method "python", in Python with billing.chain. Both give the same answer.
    """
    if method == "auto":
        method = "sql" if connection.vendor == "postgresql" else "python"
    if method == "sql":
        count, bad, last_hash = _verify_in_postgres(partition)
        if bad is not None:
            row_id, sequence, position, kind = bad
            problem = {
                "gap": f"sequence {position} is missing (found {sequence}): a row was removed",
                "link": "prev_hash does not match the previous row's hash",
                "changed": "the row's fields no longer match its hash: it was changed",
            }[kind]
            return LedgerVerification(partition, position - 1, False, row_id, sequence, problem)
        return _check_head(partition, count, last_hash)
    return _verify_in_python(partition, chunk_size)


def _check_head(partition: str, checked: int, last_hash: str) -> LedgerVerification:
    head = LedgerHead.objects.filter(partition=partition).first()
    if head is not None and (head.last_sequence, head.last_hash) != (checked, last_hash):
        return LedgerVerification(
            partition,
            checked,
            False,
            None,
            head.last_sequence,
            f"the chain ends at sequence {checked} but its head records {head.last_sequence}: rows are missing",
        )
    return LedgerVerification(partition, checked, True)


def _verify_in_python(partition: str, chunk_size: int) -> LedgerVerification:
    columns = ("id", "sequence", "prev_hash", "row_hash", *ALL_CHAINED_FIELDS)
    rows = (
        UsageRecord.objects.filter(partition=partition)
        .order_by("sequence")
        .values_list(*columns)
        .iterator(chunk_size=chunk_size)
    )
    expected_sequence, prev = 1, GENESIS_HASH
    checked = 0

    def bad(row_id: int, sequence: int, problem: str) -> LedgerVerification:
        return LedgerVerification(partition, checked, False, row_id, sequence, problem)

    for values in rows:
        row_id, sequence, prev_hash, row_hash = values[:4]
        if sequence != expected_sequence:
            return bad(
                row_id,
                sequence,
                f"sequence {expected_sequence} is missing (found {sequence}): a row was removed",
            )
        if prev_hash != prev:
            return bad(row_id, sequence, "prev_hash does not match the previous row's hash")
        if chain_hash_values(values[4:], prev) != row_hash:
            return bad(row_id, sequence, "the row's fields no longer match its hash: it was changed")
        prev = row_hash
        expected_sequence += 1
        checked += 1
    return _check_head(partition, checked, prev)


def cost_avoided_by_cache(*, since_day: date, teams: frozenset[str] | None = None) -> dict[str, Decimal]:
    """What the response cache saved since `since_day` (UTC), per currency: the sum of its hit
    rows' cost_avoided (inference.cache). `teams` (team slugs): those teams' only; None: all.
    Read from the ledger (the hits' rows only, through a partial index), not the rollups."""
    rows = UsageRecord.objects.filter(
        cost_avoided__isnull=False,
        reversed_by__isnull=True,  # a reversed hit saved nothing
        occurred_at__gte=datetime.combine(since_day, time.min, tzinfo=UTC),
    )
    if teams is not None:
        rows = rows.filter(team__in=teams)
    totals = rows.values("currency").annotate(total=Sum("cost_avoided")).order_by("currency")
    return {t["currency"]: t["total"] for t in totals}
