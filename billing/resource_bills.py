"""Bills for resources held or moved: accelerator time and egress, priced per unit by the
ledger's one writer (billing.services.usage_record)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from billing.models import Unit, UsageRecord
from billing.services import SECONDS_PER_HOUR, usage_record
from registry.models import Cluster, Deployment, RegisteredModel


def accelerator_time_bill(
    *,
    cluster: Cluster,
    seconds: Decimal,
    accelerators: int,
    subject_type: str,
    subject_id: str,
    idempotency_key: str,
    at: datetime,
    description: str,
    deployment: Deployment | None = None,
    model: RegisteredModel | None = None,
    team: str = "",
) -> UsageRecord:
    """Bill `accelerators` accelerators of `cluster` held for `seconds` as accelerator-hours.

    The one place accelerator time becomes a ledger row (probe jobs, training chunks,
    self-hosted serving). The quantity is seconds / 3600 × accelerators, in that order, and
    `usage_record` prices it at the accelerator-hour price in force at `at` for the cluster (or
    the deployment), keeping that price-book version on the row. `seconds` is what the caller
    measured and stores on its own row (rounded to the millisecond), so the bill reproduces it.
    Idempotent on `idempotency_key`: a retried call returns the row written the first time.
    Raises NoPriceError, writing nothing, when no price is in force.
    """
    return usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=seconds / SECONDS_PER_HOUR * accelerators,
        occurred_at=at,
        idempotency_key=idempotency_key,
        subject_type=subject_type,
        subject_id=subject_id,
        cluster=cluster,
        deployment=deployment,
        model=model,
        team=team,  # a training run's team: its team budgets count the run's accelerator time
        description=description,
    )


BYTES_PER_GB = Decimal(10**9)  # GB as cloud egress is priced and FOCUS names it: 10^9 bytes


def egress_bill(
    *,
    cluster: Cluster,
    nbytes: int,
    subject_type: str,
    subject_id: str,
    idempotency_key: str,
    at: datetime,
    description: str,
    team: str = "",
) -> UsageRecord:
    """Bill `nbytes` that left `cluster` (its store or its workers) as GB of egress.

    The one place data movement becomes a ledger row (a training learner's deltas leaving its
    cluster's own store, a checkpoint copied out of it when the learner moves). The quantity
    is the measured bytes / 10^9, exact to the byte at the ledger's 9 places, priced at the
    cluster's (or its provider's) egress_gb price in force at `at`. Idempotent on
    `idempotency_key`; NoPriceError, writing nothing, when no egress price is in force.
    """
    return usage_record(
        unit=Unit.EGRESS_GB,
        quantity=Decimal(nbytes) / BYTES_PER_GB,
        occurred_at=at,
        idempotency_key=idempotency_key,
        subject_type=subject_type,
        subject_id=subject_id,
        cluster=cluster,
        team=team,
        description=description,
    )
