"""Build-or-buy tasks (control queue): score one model version; beat's sweep for missed ones."""

from __future__ import annotations

from celery import shared_task

from decisions.buildbuy import services as buildbuy


@shared_task(name=buildbuy.VERSION_EVALUATE, ignore_result=True)
def version_evaluate(evaluation_id: int) -> None:
    """Serve and score one version (claims it first: a duplicate delivery does nothing)."""
    buildbuy.version_evaluation_execute(evaluation_id=evaluation_id)


@shared_task(name="decisions.version_evaluations_sweep", ignore_result=True)
def version_evaluations_sweep() -> int:
    """Periodic (beat): evaluations a lost signal or a killed worker left behind."""
    return len(buildbuy.version_evaluations_sweep())
