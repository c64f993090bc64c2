"""Periodic billing work (control queue)."""

from __future__ import annotations

from celery import shared_task

from billing.rollups import rollups_update


@shared_task(name="billing.rollups_update", ignore_result=True)
def rollups_update_task() -> int:
    """Fold new ledger rows into the daily rollups (idempotent; safe to overlap)."""
    return rollups_update()
