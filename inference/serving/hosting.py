"""Bill a self-hosted deployment's accelerator time as it is held (serve_model calls this).

The ledger rows carry the deployment and its hosting cluster, priced at the cluster's
accelerator-hour price; billing.selfhosted divides that spend by the tokens the deployment
served to get its $/1M tokens. Each interval is keyed by its start, so a retried call bills it once.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from billing.models import UsageRecord
from billing.resource_bills import accelerator_time_bill
from registry.models import Deployment


def hosting_interval_bill(
    *,
    deployment: Deployment,
    started_at: datetime,
    ended_at: datetime,
    accelerators: int = 1,
    bill_to: tuple[str, str] | None = None,
    team: str = "",
) -> UsageRecord | None:
    """One ledger row for [started_at, ended_at) of serving; None for an empty interval.

    `bill_to`: the (subject type, subject id) that pays, e.g. a training run serving its own
    model version to score it; by default the deployment's hosting (deployment_hosting:<id>)."""
    cluster = deployment.hosting_cluster
    if cluster is None:
        raise ValueError(f"deployment {deployment.slug} has no hosting cluster to bill")
    seconds = Decimal(str(round((ended_at - started_at).total_seconds(), 3)))
    if seconds <= 0:
        return None
    return accelerator_time_bill(
        cluster=cluster,
        seconds=seconds,
        accelerators=accelerators,
        subject_type=bill_to[0] if bill_to else "deployment_hosting",
        subject_id=bill_to[1] if bill_to else str(deployment.pk),
        team=team,
        idempotency_key=f"hosting:{deployment.pk}:{started_at.isoformat()}",
        at=ended_at,
        deployment=deployment,
        model=deployment.model,
        description=f"serving {deployment.slug}: {seconds} s x {accelerators} accelerator(s)",
    )
