"""Decisions tasks of the control queue (thin: the work is in stack.decisions.replay)."""

from __future__ import annotations

from celery import shared_task

from stack.decisions import replay


@shared_task(name="decisions.replay_study_run", ignore_result=True)
def replay_study_run(study_id: int) -> None:
    """Run one pending replay study (claims it; a duplicate delivery does nothing)."""
    replay.replay_study_execute(study_id=study_id)


@shared_task(name="decisions.replay_studies_resume", ignore_result=True)
def replay_studies_resume() -> int:
    """Periodic (beat): queue again the studies whose worker died or whose message was lost."""
    return len(replay.replay_studies_resume())
