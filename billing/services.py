"""Writes to the ledger. `usage_record` is the only writer of UsageRecord."""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from django.db import IntegrityError, transaction

from billing.models import PriceBook, Unit, UsageRecord
from billing.selectors import price_book_next_version, price_in_force
from stack.models import Cluster, Deployment, Provider, RegisteredModel, Workflow

AMOUNT_QUANTUM = Decimal("0.000000001")  # matches UsageRecord.amount's 9 places


class NoPriceError(LookupError):
    """No price-book version covers this usage; nothing was billed."""


def _quantize(value: Decimal) -> Decimal:
    return value.quantize(AMOUNT_QUANTUM, rounding=ROUND_HALF_EVEN)


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
    description: str = "",
) -> UsageRecord:
    """Price and append one usage record; idempotent on `idempotency_key`.

    The price is the price-book version in force at `occurred_at` for the
    cluster or deployment (falling back to a provider-wide price), and the
    record keeps that version, so a later price change never rewrites history.
    """
    if not isinstance(quantity, Decimal):
        raise TypeError("quantity must be a Decimal")
    if quantity < 0:
        raise ValueError("quantity must not be negative; corrections are reversals")
    existing = UsageRecord.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing
    if cluster is not None and provider is None:
        provider = cluster.provider
    if deployment is not None and provider is None:
        provider = deployment.provider
    if deployment is not None and model is None:
        model = deployment.model
    # The row must explain itself: amount is computed from the stored (rounded)
    # quantity, so quantity × unit_price reproduces it exactly.
    quantity = _quantize(quantity)
    price = price_in_force(
        unit=unit, at=occurred_at, cluster=cluster, deployment=deployment, provider=provider
    )
    if price is None:
        target = cluster or deployment or provider
        raise NoPriceError(f"no {unit} price in force for {target} at {occurred_at.isoformat()}")
    try:
        with transaction.atomic():
            return UsageRecord.objects.create(
                occurred_at=occurred_at,
                subject_type=subject_type,
                subject_id=subject_id,
                description=description[:200],
                provider=provider,
                cluster=cluster,
                deployment=deployment,
                model=model,
                workflow=workflow,
                team=team or (workflow.team if workflow is not None else ""),
                quantity=quantity,
                unit=unit,
                unit_price=price.unit_price,
                amount=_quantize(quantity * price.unit_price),
                currency=price.currency,
                price_book=price,
                idempotency_key=idempotency_key,
            )
    except IntegrityError:
        # Another process billed the same key first: that row stands.
        return UsageRecord.objects.get(idempotency_key=idempotency_key)


def usage_reverse(*, record: UsageRecord, reason: str, occurred_at: datetime) -> UsageRecord:
    """Append a reversal row that cancels `record` (the ledger is never edited)."""
    if record.reverses_id is not None:
        raise ValueError("a reversal cannot itself be reversed")
    key = f"reversal:{record.pk}"
    existing = UsageRecord.objects.filter(idempotency_key=key).first()
    if existing is not None:
        return existing
    return UsageRecord.objects.create(
        occurred_at=occurred_at,
        subject_type=record.subject_type,
        subject_id=record.subject_id,
        description=f"reversal: {reason}"[:200],
        provider=record.provider,
        cluster=record.cluster,
        deployment=record.deployment,
        model=record.model,
        workflow=record.workflow,
        team=record.team,
        quantity=-record.quantity,
        unit=record.unit,
        unit_price=record.unit_price,
        amount=-record.amount,
        currency=record.currency,
        price_book=record.price_book,
        reverses=record,
        idempotency_key=key,
    )


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
) -> PriceBook:
    """Add a new price version for a target; older versions stay for history."""
    if unit_price < 0:
        raise ValueError("a price cannot be negative")
    if cluster is None and deployment is None and provider is None:
        raise ValueError("a price needs a cluster, a deployment or a provider")
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
            version=price_book_next_version(
                cluster=cluster, deployment=deployment, provider=provider, unit=unit
            ),
            note=note,
        )
