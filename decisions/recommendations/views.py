"""Pages: /decisions/recommendations/ (the list, team-filtered) and /decisions/recommendations/<id>/
(the figures, the evidence, Accept and Dismiss). The work is in recommendation_services."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils.http import urlencode
from django.views import View

from decisions.models import Recommendation
from decisions.recommendations import services
from decisions.recommendations.selectors import (
    get_recommendation_for_user,
    recommendation_reconcile,
    recommendation_stale,
    recommendations_visible,
    replay_request_ids,
)
from registry.auth.principal import can_see_costs
from registry.auth.teams import user_may_change_team_object
from registry.views import RoleRequiredMixin, require_team_write, team_filter_from_request

LIST_ROWS = 200
EVIDENCE_IDS_SHOWN = 50


class StateFilterForm(forms.Form):
    state = forms.ChoiceField(choices=[("", "any state"), *Recommendation.State.choices], required=False)


class DismissForm(forms.Form):
    reason = forms.CharField(
        max_length=500, widget=forms.Textarea(attrs={"rows": 2}), help_text="Why this proposal is not taken"
    )


class RecommendationListView(RoleRequiredMixin, View):
    """Every recommendation of the workflows the caller sees (?team=, ?state=), newest first."""

    def get(self, request: HttpRequest) -> HttpResponse:
        team_filter = team_filter_from_request(request)
        state_form = StateFilterForm(request.GET or None)
        state = state_form.cleaned_data["state"] if state_form.is_valid() else ""
        rows = list(
            recommendations_visible(user=request.user, teams=team_filter.teams, state=state)[:LIST_ROWS]
        )
        stale_ids = {
            row.pk
            for row in rows
            if row.state == Recommendation.State.PROPOSED and recommendation_stale(recommendation=row)
        }
        status = (
            400 if team_filter.status == 400 or (state_form.is_bound and not state_form.is_valid()) else 200
        )
        return render(
            request,
            "decisions/recommendation_list.html",
            {"rows": rows, "stale_ids": stale_ids, "team_filter": team_filter, "state_form": state_form},
            status=status,
        )


class RecommendationDetailView(RoleRequiredMixin, View):
    """One recommendation: figures and evidence for every role; Accept and Dismiss (POST
    `action`) for operators of its workflow's team."""

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        rec = get_recommendation_for_user(pk=pk, user=request.user)
        return self._render(request, rec, DismissForm())

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        rec = get_recommendation_for_user(pk=pk, user=request.user)
        require_team_write(request.user, rec.workflow.team_id)
        action = request.POST.get("action", "")
        form = DismissForm()
        try:
            if action == "accept":
                rec = services.recommendation_accept(recommendation_id=rec.pk, user=request.user)  # type: ignore[arg-type]
                messages.success(
                    request,
                    f"Accepted: {rec.workflow.slug} is on policy v{_version(rec)}.",
                )
                return HttpResponseRedirect(services.recommendation_url(recommendation=rec))
            if action == "dismiss":
                form = DismissForm(request.POST)
                if form.is_valid():
                    services.recommendation_dismiss(
                        recommendation_id=rec.pk,
                        user=request.user,  # type: ignore[arg-type]
                        reason=form.cleaned_data["reason"],
                    )
                    messages.success(request, "Dismissed.")
                    return HttpResponseRedirect(services.recommendation_url(recommendation=rec))
                return self._render(request, rec, form, status=400)
        except services.RecommendationError as exc:
            if exc.field == "reason":
                form.add_error("reason", str(exc))
            return self._render(request, rec, form, error=str(exc), status=exc.status_code)
        return self._render(request, rec, form, error="Choose Accept or Dismiss.", status=400)

    def _render(
        self,
        request: HttpRequest,
        rec: Recommendation,
        form: DismissForm,
        *,
        error: str = "",
        status: int = 200,
    ) -> HttpResponse:
        rec.refresh_from_db()
        costs = can_see_costs(request.user, rec.workflow.team_id)  # the workflow's team's money
        stale = rec.state == Recommendation.State.PROPOSED and recommendation_stale(recommendation=rec)
        after_ids = replay_request_ids(candidate=rec.candidate) if rec.candidate else ()
        context: dict[str, Any] = {
            "rec": rec,
            "stale": stale,
            "form": form,
            "error": error,
            "can_decide": rec.state == Recommendation.State.PROPOSED
            and user_may_change_team_object(request.user, rec.workflow.team_id),
            "replayed_ids": after_ids[:EVIDENCE_IDS_SHOWN],
            "replayed_more": max(len(after_ids) - EVIDENCE_IDS_SHOWN, 0),
            "eval_runs": list(rec.eval_runs.all()),
            "can_see_costs": costs,
        }
        if costs:
            # Money only for those who may see it (registry.auth.costs): the ledger check too.
            context["reconciliation"] = recommendation_reconcile(recommendation=rec)
            context["ledger_link"] = _ledger_link(rec)
        return render(request, "decisions/recommendation_detail.html", context, status=status)


def _version(rec: Recommendation) -> str:
    policy = rec.accepted_policy_version
    return str(policy.version) if policy is not None else "?"


def _ledger_link(rec: Recommendation) -> str:
    """The ledger page filtered to the workflow over the days of the study's replay (it also
    lists the workflow's other rows of those days; the per-request links are exact)."""
    study = rec.study
    if study is None:
        return ""
    start = study.started_at or study.created_at
    end = study.finished_at or rec.created_at
    query = {
        "workflow": rec.workflow.slug,
        "since": start.date().isoformat(),
        "until": (end.date() + timedelta(days=1)).isoformat(),
    }
    return "/billing/ledger/?" + urlencode(query)
