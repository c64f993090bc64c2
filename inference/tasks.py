"""Inference tasks of the control queue (thin: the work is in inference.quality and inference.batch)."""

from __future__ import annotations

from celery import shared_task

from inference import idempotency, retention
from inference.batch import jobs as batch
from inference.quality import services as quality
from inference.recording import journal_fold_all


@shared_task(name=quality.EVAL_SET_RUN, ignore_result=True)
def eval_set_run(run_id: int) -> None:
    """Run one pending EvalRun against its deployment (claims it; a duplicate delivery does nothing)."""
    quality.eval_run_execute(run_id=run_id)


@shared_task(name="inference.eval_sets_scheduled", ignore_result=True)
def eval_sets_scheduled() -> int:
    """Periodic (beat): start runs of the scheduled eval sets on every deployment of their routes."""
    return len(quality.eval_sets_scheduled())


@shared_task(name=batch.BATCH_JOB_RUN, ignore_result=True)
def batch_job_run(job_id: int) -> None:
    """Run or resume one batch job under its lease (a duplicate delivery finds it held and returns)."""
    batch.batch_job_execute(job_id=job_id)


@shared_task(name="inference.batch_jobs_resume", ignore_result=True)
def batch_jobs_resume() -> int:
    """Periodic (beat): re-queue batch jobs whose worker died or whose message was lost."""
    return len(batch.batch_jobs_resume())


@shared_task(name="inference.journal_fold", ignore_result=True)
def journal_fold() -> int:
    """Periodic (beat): fold journaled requests that no web process folded into the ledger."""
    return journal_fold_all()


@shared_task(name="inference.retained_prompts_purge", ignore_result=True)
def retained_prompts_purge() -> dict[str, int]:
    """Periodic (beat): delete kept prompts past their retention, and replay objects holding them."""
    return retention.retained_prompts_purge()


@shared_task(name="inference.idempotent_answers_purge", ignore_result=True)
def idempotent_answers_purge() -> int:
    """Periodic (beat): drop answers kept for Idempotency-Key replays once their window passed."""
    return idempotency.idempotent_answers_purge()
