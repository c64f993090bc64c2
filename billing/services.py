"""Writes to the ledger. `usage_record_batch` (and `usage_record`, one row) is the only writer of UsageRecord."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from billing.budgets import budget_record_spend
from billing.chain import ALL_CHAINED_FIELDS, GENESIS_HASH, chain_hash_values
from billing.models import LEDGER_PARTITION, LedgerHead, PriceBook, PriceSource, Unit, UsageRecord
from billing.money import LEDGER_QUANTUM
from billing.selectors import PriceResolver, price_book_next_version
from registry.errors import DomainError
from registry.models import Cluster, Deployment, Provider, RegisteredModel, Workflow

AMOUNT_QUANTUM = LEDGER_QUANTUM  # UsageRecord.amount's 9 places (the name inference.recording imports)


class NoPriceError(DomainError, LookupError):
    """No price-book version covers this usage; nothing was billed."""


class PriceInvalid(DomainError, ValueError):
    """A price version that cannot be published; `field` names the input at fault."""


def _quantize(value: Decimal) -> Decimal:
    return value.quantize(AMOUNT_QUANTUM, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True)
class UsageInput:
    """One unit of work to bill (see usage_record for the fields' meaning)."""

    unit: Unit | str
    quantity: Decimal
    occurred_at: datetime
    idempotency_key: str
    subject_type: str
    subject_id: str
    cluster: Cluster | None = None
    deployment: Deployment | None = None
    provider: Provider | None = None
    model: RegisteredModel | None = None
    workflow: Workflow | None = None
    team: str = ""
    # The API key whose request caused the spend (ApiToken id); None when no key asked for it.
    api_key_id: int | None = None
    description: str = ""
    # Reversals only: the row being cancelled (its price is reused).
    reverses: UsageRecord | None = None
    # A response-cache hit: what the cached answer cost when it was bought (the row bills 0).
    cost_avoided: Decimal | None = None


def usage_record(
    *,
    unit: Unit | str,
    quantity: Decimal,
    occurred_at: datetime,
    idempotency_key: str,
    subject_type: str,
    subject_id: str,
    cluster: Cluster | None = None,
    deployment: Deployment | None = None,
    provider: Provider | None = None,
    model: RegisteredModel | None = None,
    workflow: Workflow | None = None,
    team: str = "",
    api_key_id: int | None = None,
    description: str = "",
) -> UsageRecord:
    """Price and append one usage record; idempotent on `idempotency_key`.

    The price is the price-book version in force at `occurred_at` for the
    cluster or deployment (falling back to a provider-wide price), and the
    record keeps that version, so a later price change never rewrites history.
    """
    item = UsageInput(
        unit=unit,
        quantity=quantity,
        occurred_at=occurred_at,
        idempotency_key=idempotency_key,
        subject_type=subject_type,
        subject_id=subject_id,
        cluster=cluster,
        deployment=deployment,
        provider=provider,
        model=model,
        workflow=workflow,
        team=team,
        api_key_id=api_key_id,
        description=description,
    )
    return usage_record_batch(items=[item])[0]


def _lock_head(partition: str) -> LedgerHead:
    """Lock the chain's head row; every append to the partition queues here."""
    head = LedgerHead.objects.select_for_update().filter(partition=partition).first()
    if head is not None:
        return head
    try:
        with transaction.atomic():
            LedgerHead.objects.create(partition=partition)
    except IntegrityError:
        pass  # another writer created it first
    return LedgerHead.objects.select_for_update().get(partition=partition)


def ledger_partition_names() -> list[str]:
    """The partitions writers spread over: "main", then "main-1" … (settings.LEDGER_PARTITIONS).

    Each partition is its own hash chain with its own head; `ledger verify` checks each, exports
    merge them by time. Lowering the setting leaves the other chains as they are (read, verified
    and exported like any other), only no longer appended to."""
    count = settings.LEDGER_PARTITIONS
    return [LEDGER_PARTITION] + [f"{LEDGER_PARTITION}-{i}" for i in range(1, count)]


_heads_made: set[tuple[str, ...]] = set()


def _make_missing_heads(cursor: Any, names: list[str]) -> None:
    """Insert the heads of `names` that do not exist. Only the missing ones: an INSERT that meets
    an existing head which another writer has updated but not committed waits for that writer
    (PostgreSQL must learn whether the conflict stands), which is the queue partitions avoid."""
    table = LedgerHead._meta.db_table
    cursor.execute(
        f"INSERT INTO {table} (partition, last_sequence, last_hash) "  # noqa: S608
        f"SELECT name, 0, %s FROM unnest(%s::text[]) AS name "
        f"WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE partition = name) "
        "ON CONFLICT (partition) DO NOTHING",
        [GENESIS_HASH, names],
    )


def _lock_free_head() -> LedgerHead:
    """Lock the head of whichever partition no other writer holds (SKIP LOCKED), so concurrent
    writers append in parallel, each to its own chain; when every head is held, queue on one
    picked by thread, which spreads the waiting writers over the partitions."""
    names = ledger_partition_names()
    if len(names) == 1 or connection.vendor != "postgresql":
        return _lock_head(names[0])  # SQLite serialises writers anyway
    table = LedgerHead._meta.db_table
    with connection.cursor() as cursor:
        if tuple(names) not in _heads_made:
            # Make every partition's head once per process and setting: the migrations make only
            # "main", and a writer that finds "main" free would otherwise never make the others.
            _make_missing_heads(cursor, names)
            _heads_made.add(tuple(names))
        for attempt in range(2):
            cursor.execute(
                f"SELECT partition, last_sequence, last_hash FROM {table} "  # noqa: S608
                "WHERE partition = ANY(%s) ORDER BY partition LIMIT 1 FOR UPDATE SKIP LOCKED",
                [names],
            )
            found = cursor.fetchone()
            if found is not None:
                head = LedgerHead(partition=found[0], last_sequence=found[1], last_hash=found[2])
                head._state.adding = False
                head._state.db = connection.alias
                return head
            if attempt == 0:
                # Every head is held, or some do not exist yet (a new setting, a fresh ledger).
                _make_missing_heads(cursor, names)
    return _lock_head(names[threading.get_ident() % len(names)])


def usage_record_batch(
    *, items: Sequence[UsageInput], partition: str | None = None, prices: PriceResolver | None = None
) -> list[UsageRecord]:
    """Append many usage records in one transaction: priced, chained, idempotent.

    Returns one record per item, in order (an existing record for a key that was
    billed before). Any item without a price fails the whole batch: nothing is
    written (NoPriceError). `prices` lets a hot caller (the inference router) pass
    a resolver it keeps warm and drops whenever a PriceBook row is saved.
    `partition`: the chain to append to; by default whichever partition's head is
    free (ledger_partition_names), so concurrent writers do not queue on one lock.
    """
    for item in items:
        if not isinstance(item.quantity, Decimal):
            raise TypeError("quantity must be a Decimal")
        if item.quantity < 0 and item.reverses is None:
            raise ValueError("quantity must not be negative; corrections are reversals")
        if item.occurred_at.tzinfo is None:
            raise ValueError("occurred_at must be timezone-aware")
    keys = [item.idempotency_key for item in items]
    for attempt in range(3):
        try:
            return _append(items, keys, partition, prices)
        except IntegrityError as exc:
            # With several partitions, a writer on another chain may have committed one of these
            # keys after our check (the unique index waited for it): the next try finds it billed.
            if attempt == 2 or "idempotency_key" not in str(exc):
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _append(
    items: Sequence[UsageInput], keys: list[str], partition: str | None, prices: PriceResolver | None
) -> list[UsageRecord]:
    with transaction.atomic():
        head = _lock_head(partition) if partition is not None else _lock_free_head()
        partition = head.partition
        # Under the head lock no writer of this partition can add these keys meanwhile; one of
        # another partition would trip the unique index (usage_record_batch then retries).
        by_key = {r.idempotency_key: r for r in _already_billed(keys)}
        prices = prices if prices is not None else PriceResolver()
        recorded_at = timezone.now()  # one time per batch
        new_rows: list[UsageRecord] = []
        for item in items:
            if item.idempotency_key in by_key:
                continue
            row = _priced_row(item, prices, recorded_at)
            head.last_sequence += 1
            row.partition = partition
            row.sequence = head.last_sequence
            row.prev_hash = head.last_hash
            row.row_hash = chain_hash_values([getattr(row, f) for f in ALL_CHAINED_FIELDS], row.prev_hash)
            head.last_hash = row.row_hash
            new_rows.append(row)
            by_key[item.idempotency_key] = row
        if new_rows:
            _insert(new_rows)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {LedgerHead._meta.db_table} SET last_sequence = %s, last_hash = %s "  # noqa: S608
                    "WHERE partition = %s",
                    [head.last_sequence, head.last_hash, partition],
                )
            # Still under the head lock: budget totals move exactly with the ledger.
            budget_record_spend(rows=new_rows)
    return [by_key[key] for key in keys]


def _already_billed(keys: list[str]) -> list[UsageRecord]:
    """Existing records for these idempotency keys (usually none)."""
    if connection.vendor == "postgresql":
        # One array parameter (no ORM query building on the hot path, no thousands of
        # placeholders); then full rows only for the (rare) keys that exist.
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT idempotency_key FROM {UsageRecord._meta.db_table} WHERE idempotency_key = ANY(%s)",  # noqa: S608
                [keys],
            )
            keys = [key for (key,) in cursor.fetchall()]
        if not keys:
            return []
    return list(UsageRecord.objects.filter(idempotency_key__in=keys))


def _insert(rows: list[UsageRecord]) -> None:
    """Insert new ledger rows; on PostgreSQL with COPY, several times faster than INSERT.

    COPY returns no ids, so the ids are drawn from the table's sequence first
    and written explicitly (the id column is GENERATED BY DEFAULT).
    """
    if connection.vendor != "postgresql":
        UsageRecord.objects.bulk_create(rows, batch_size=2000)
        return
    table = UsageRecord._meta.db_table
    fields = UsageRecord._meta.concrete_fields
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) FROM generate_series(1, %s)",  # noqa: S608
            [len(rows)],
        )
        for row, (row_id,) in zip(rows, cursor.fetchall(), strict=True):
            row.pk = row_id
            row._state.adding = False
            row._state.db = connection.alias
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        # The raw cursor's errors reach callers as Django's (IntegrityError for a duplicate key).
        with (
            connection.wrap_database_errors,
            cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row([getattr(row, f.attname) for f in fields])


_ROW_ATTNAMES = [f.attname for f in UsageRecord._meta.concrete_fields]


def _priced_row(item: UsageInput, prices: PriceResolver, recorded_at: datetime) -> UsageRecord:
    provider = item.provider
    if item.cluster is not None and provider is None:
        provider = item.cluster.provider
    if item.deployment is not None and provider is None:
        provider = item.deployment.provider
    model = item.model
    if item.deployment is not None and model is None:
        model = item.deployment.model
    # The row must explain itself: amount is computed from the stored (rounded)
    # quantity, so quantity × unit_price reproduces it exactly.
    quantity = _quantize(item.quantity)
    if item.reverses is not None:
        price = item.reverses.price_book
        unit_price = item.reverses.unit_price
    else:
        found = prices.resolve(
            unit=item.unit,
            at=item.occurred_at,
            cluster_id=item.cluster.pk if item.cluster is not None else None,
            deployment_id=item.deployment.pk if item.deployment is not None else None,
            provider_id=provider.pk if provider is not None else None,
        )
        if found is None:
            target = item.cluster or item.deployment or provider
            raise NoPriceError(
                f"no {item.unit} price in force for {target} at {item.occurred_at.isoformat()}"
            )
        price, unit_price = found, found.unit_price
    values = {
        "occurred_at": item.occurred_at,
        "recorded_at": recorded_at,
        "subject_type": item.subject_type,
        "subject_id": item.subject_id,
        "description": item.description[:200],
        "provider_id": _pk(provider),
        "cluster_id": _pk(item.cluster),
        "deployment_id": _pk(item.deployment),
        "model_id": _pk(model),
        "workflow_id": _pk(item.workflow),
        "team": item.team or (item.workflow.team_slug if item.workflow is not None else ""),
        "api_key_id": item.api_key_id,
        "cost_avoided": _quantize(item.cost_avoided) if item.cost_avoided is not None else None,
        "quantity": quantity,
        "unit": str(item.unit),
        "unit_price": unit_price,
        "amount": _quantize(quantity * unit_price),
        "currency": price.currency,
        "price_book_id": price.pk,
        "reverses_id": _pk(item.reverses),
        "idempotency_key": item.idempotency_key,
    }
    # Positional construction: Django's fast path, several times quicker than
    # keyword arguments with related objects, which matters at 20k rows/s.
    return UsageRecord(*[values.get(name) for name in _ROW_ATTNAMES])


def _pk(obj: Any) -> Any:
    return None if obj is None else obj.pk


def usage_reverse(*, record: UsageRecord, reason: str, occurred_at: datetime) -> UsageRecord:
    """Append a reversal row that cancels `record` (the ledger is never edited)."""
    if record.reverses_id is not None:
        raise ValueError("a reversal cannot itself be reversed")
    item = UsageInput(
        unit=record.unit,
        quantity=-record.quantity,
        occurred_at=occurred_at,
        idempotency_key=f"reversal:{record.pk}",
        subject_type=record.subject_type,
        subject_id=record.subject_id,
        cluster=record.cluster,
        deployment=record.deployment,
        provider=record.provider,
        model=record.model,
        workflow=record.workflow,
        team=record.team,
        api_key_id=record.api_key_id,
        description=f"reversal: {reason}",
        reverses=record,
    )
    return usage_record_batch(items=[item])[0]


def price_book_publish(
    *,
    unit: Unit | str,
    unit_price: Decimal,
    effective_from: datetime,
    currency: str = "USD",
    cluster: Cluster | None = None,
    deployment: Deployment | None = None,
    provider: Provider | None = None,
    note: str = "",
    effective_to: datetime | None = None,
    source: PriceSource | str = PriceSource.MANUAL,
) -> PriceBook:
    """Add a new price version for a target; older versions stay for history."""
    if effective_to is not None and effective_to <= effective_from:
        raise PriceInvalid("effective_to must be after effective_from", field="effective_to")
    if unit_price < 0:
        raise PriceInvalid("a price cannot be negative", field="unit_price")
    if cluster is None and deployment is None and provider is None:
        raise PriceInvalid("a price needs a cluster, a deployment or a provider", field="cluster")
    if cluster is not None or deployment is not None:
        provider = None  # a cluster or deployment price is not also provider-wide
    with transaction.atomic():
        # Lock the target's existing versions so two publishers get n+1 and n+2.
        list(
            PriceBook.objects.select_for_update().filter(
                cluster=cluster, deployment=deployment, provider=provider, unit=unit
            )
        )
        return PriceBook.objects.create(
            cluster=cluster,
            deployment=deployment,
            provider=provider,
            unit=unit,
            unit_price=unit_price,
            currency=currency,
            effective_from=effective_from,
            effective_to=effective_to,
            source=source,
            version=price_book_next_version(
                cluster=cluster, deployment=deployment, provider=provider, unit=unit
            ),
            note=note,
        )


SECONDS_PER_HOUR = Decimal(3600)  # accelerator time is billed per hour (billing.resource_bills)
