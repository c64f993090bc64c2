"""Reads of the decisions app: replay studies as a user may see them (through their workflow)."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet
from django.http import Http404

from decisions.models import ReplayStudy
from registry.selectors import workflows_visible


def replay_studies_for_user(*, user: User | AnonymousUser) -> QuerySet[ReplayStudy]:
    """The studies of the workflows the user sees (its teams' for a team member), newest first."""
    return ReplayStudy.objects.filter(workflow__in=workflows_visible(user=user)).select_related(
        "workflow", "baseline_deployment", "judge_deployment", "created_by"
    )


def get_replay_study_for_user(*, study_id: int, user: User | AnonymousUser) -> ReplayStudy:
    """The study if the user may see it; 404 otherwise, as for one that does not exist."""
    study = replay_studies_for_user(user=user).filter(pk=study_id).first()
    if study is None:
        raise Http404("no such replay study")
    return study
