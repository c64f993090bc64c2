"""Decisions tasks of the control queue (thin: the work is in decisions.replay.services)."""

from __future__ import annotations

from celery import shared_task

from decisions.replay import services as replay


@shared_task(name=replay.REPLAY_STUDY_RUN, ignore_result=True)
def replay_study_run(study_id: int) -> None:
    """Run one pending replay study (claims it; a duplicate delivery does nothing)."""
    replay.replay_study_execute(study_id=study_id)


@shared_task(name="decisions.replay_studies_resume", ignore_result=True)
def replay_studies_resume() -> int:
    """Periodic (beat): queue again the studies whose worker died or whose message was lost."""
    return len(replay.replay_studies_resume())
