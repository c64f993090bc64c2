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
