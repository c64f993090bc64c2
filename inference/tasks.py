"""Inference tasks of the control queue (thin: the work is in inference.quality / inference.batch)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="inference.eval_set_run", ignore_result=True)
def eval_set_run(run_id: int) -> None:
    """Run one pending EvalRun against its deployment (claims it; a duplicate delivery does nothing)."""
    from inference.quality import eval_run_execute

    eval_run_execute(run_id=run_id)


@shared_task(name="inference.eval_sets_scheduled", ignore_result=True)
def eval_sets_scheduled() -> int:
    """Periodic (beat): start runs of the scheduled eval sets on every deployment of their routes."""
    from inference.quality import eval_sets_scheduled as start_scheduled

    return len(start_scheduled())


@shared_task(name="inference.batch_job_run", ignore_result=True)
def batch_job_run(job_id: int) -> None:
    """Run or resume one batch job under its lease (a duplicate delivery finds it held and returns)."""
    from inference.batch import batch_job_execute

    batch_job_execute(job_id=job_id)


@shared_task(name="inference.batch_jobs_resume", ignore_result=True)
def batch_jobs_resume() -> int:
    """Periodic (beat): re-queue batch jobs whose worker died or whose message was lost."""
    from inference.batch import batch_jobs_resume as resume

    return len(resume())
