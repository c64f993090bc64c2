"""Replay study pages (server-rendered; studies are created through /api/replay-studies/)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views import View

from decisions.replay.selectors import get_replay_study_for_user, replay_studies_for_user
from registry.auth.principal import can_see_costs
from registry.views import RoleRequiredMixin


class ReplayStudyListView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest) -> HttpResponse:
        studies = replay_studies_for_user(user=request.user)[:200]
        return render(request, "decisions/replay_list.html", {"studies": studies})


class ReplayStudyDetailView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest, study_id: int) -> HttpResponse:
        study = get_replay_study_for_user(study_id=study_id, user=request.user)
        candidates = study.candidates.select_related("deployment", "batch_job").order_by("pk")
        return render(
            request,
            "decisions/replay_detail.html",
            {
                "study": study,
                "candidates": candidates,
                "sampled": len(study.sampled_request_ids),
                # The study's costs are its workflow's team's money.
                "can_see_costs": can_see_costs(request.user, study.workflow.team_id),
            },
        )
