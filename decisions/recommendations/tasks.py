"""The task that derives a finished replay study's recommendations (the replay machinery
enqueues it when a study reaches SUCCEEDED: after commit, `transaction.on_commit(partial(recommendations_derive.delay, study.pk))`)."""

from __future__ import annotations

from celery import shared_task

from decisions.recommendations.derive import LedgerPending, recommendations_from_study


@shared_task(
    name="decisions.recommendations_derive",
    ignore_result=True,
    # No queue=: CELERY_TASK_DEFAULT_QUEUE, "control". Only the journal's short delay is retried
    # (the replayed requests' ledger rows land within seconds), with backoff, capped.
    autoretry_for=(LedgerPending,),
    retry_backoff=2,
    retry_backoff_max=120,
    retry_jitter=True,
    max_retries=10,
)
def recommendations_derive(study_id: int) -> int:
    """Propose what the study supports; idempotent (a second delivery finds the same rows)."""
    return len(recommendations_from_study(study_id=study_id).recommendations)
