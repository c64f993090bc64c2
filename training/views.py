"""Training pages: probe jobs (list, dispatch, detail) and runs (list, detail with live charts,
launch form, cancel). Logic lives in training.services (writes) and training.selectors /
run_selectors (reads)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views import View

from billing.money import shown_text
from billing.selectors import usage_for_subject
from registry.auth.principal import can_see_costs, principal_of_user
from registry.auth.roles import OPERATORS
from registry.auth.teams import (
    filter_by_team,
    teams_visible,
    user_may_change_team_object,
    user_team_scope,
    user_teams_with_role,
)
from registry.views import RoleRequiredMixin, require_team_write, shared_writer
from training.charts import charts_shown, loss_curve_chart, run_figures
from training.forms import ProbeJobForm, TrainingRunForm, example_config_text
from training.models import ProbeJob, TrainingRun
from training.run_config import RunConfig, RunConfigError
from training.run_selectors import (
    run_cost_summary,
    run_learners,
    run_metric_series,
    run_metrics_payload,
    run_rank_starts,
    run_rows,
    run_timeline,
)
from training.selectors import probe_jobs_recent, run_model_versions, run_placements, run_progress
from training.services import (
    DispatchError,
    RunStateError,
    probe_job_create,
    training_run_cancel,
    training_run_create,
)

REFRESH_MS = 3000


def _run(request: HttpRequest, pk: int) -> TrainingRun:
    """The run if the caller's teams reach it; 404 otherwise, as for a run that does not exist."""
    runs = filter_by_team(TrainingRun.objects.all(), user_team_scope(request.user), "team")
    return get_object_or_404(
        runs.select_related("registered_model", "created_by", "started_from__registered_model"), pk=pk
    )


def _figures_payload(run: TrainingRun, *, costs: bool, with_template: bool = True) -> dict[str, Any]:
    """The page's figures (no money ones, and no cost, for a caller who may not see costs).
    Refreshes leave out Plotly's layout template (about 7 KB a figure, the same every time): the
    page keeps the one it got with its first draw."""
    figures = run_figures(run_metric_series(run=run), costs=costs)
    if not with_template:
        for figure in figures.values():
            figure["layout"].pop("template", None)
    payload: dict[str, Any] = {"state": run.state, "live": run.state not in TrainingRun.FINAL_STATES,
                               "figures": figures}  # fmt: skip
    if costs:
        progress = run_progress(run=run)
        # Shown as text beside the charts, as the template's |money shows it.
        payload["cost"] = f"{shown_text(progress.cost)} {progress.currency}"
    return payload


class RunListView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest) -> HttpResponse:
        principal = principal_of_user(request.user)
        rows = run_rows(teams=principal.visible_teams)
        return render(
            request,
            "training/run_list.html",
            {
                # A run's cost is its team's money: each row says whether it may show it.
                "rows": [(row, principal.sees_costs(row.run.team_id)) for row in rows],
                "can_write": user_teams_with_role(request.user, OPERATORS) != frozenset(),
            },
        )


class RunDetailView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        run = _run(request, pk)
        costs = can_see_costs(request.user, run.team_id)  # the run's team's money
        return render(
            request,
            "training/run_detail.html",
            {
                "run": run,
                "can_see_costs": costs,
                "cost": run_cost_summary(run=run) if costs else None,
                "learners": run_learners(run=run),
                "placements": run_placements(run=run),
                "model_versions": run_model_versions(run=run),
                "keep_versions": RunConfig(run.config).keep_versions,
                "rank_starts": run_rank_starts(run=run),
                "timeline": run_timeline(run=run, costs=costs),
                "charts": charts_shown(costs=costs),
                "initial": _figures_payload(run, costs=costs),
                "refresh_ms": REFRESH_MS,
                "can_cancel": user_may_change_team_object(request.user, run.team_id)
                and run.state not in TrainingRun.FINAL_STATES,
            },
        )


class RunMetricsView(RoleRequiredMixin, View):
    """The page's figures (and the raw series) for Plotly.react, on the page's session."""

    def get(self, request: HttpRequest, pk: int) -> JsonResponse:
        run = _run(request, pk)
        costs = can_see_costs(request.user, run.team_id)
        return JsonResponse(
            {
                **_figures_payload(run, costs=costs, with_template=False),
                "series": run_metrics_payload(run=run, costs=costs),
            }
        )


class RunCancelView(RoleRequiredMixin, View):
    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        run = _run(request, pk)
        require_team_write(request.user, run.team_id)
        try:
            training_run_cancel(run=run, reason=request.POST.get("reason", ""), by=request.user)  # type: ignore[arg-type]
        except RunStateError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, f"Run #{run.pk} cancelled.")
        return redirect("training-run", pk=run.pk)


class RunLaunchView(RoleRequiredMixin, View):
    # Only operators may even see the form: it exists to launch.
    read_roles = OPERATORS

    @staticmethod
    def _teams(request: HttpRequest) -> dict[str, Any]:
        """The launch form's team choices: the teams the user operates (a team-scoped user must
        pick one; a platform operator may leave it empty for a platform run)."""
        writable = user_teams_with_role(request.user, OPERATORS)
        return {"teams": teams_visible(teams=writable), "team_required": writable is not None}

    def get(self, request: HttpRequest) -> HttpResponse:
        form = TrainingRunForm(initial={"config": example_config_text()}, **self._teams(request))
        return render(request, "training/run_form.html", {"form": form})

    def post(self, request: HttpRequest) -> HttpResponse:
        form = TrainingRunForm(request.POST, **self._teams(request))
        if form.is_valid():
            try:
                run = training_run_create(
                    config=form.run_config(),
                    created_by=request.user,  # type: ignore[arg-type]
                    name=form.cleaned_data["name"],
                    # As the API: a team-scoped user launches in, starts from and reads the
                    # object-store keys of the team the run is for only.
                    teams=user_teams_with_role(request.user, OPERATORS),
                )
            except RunConfigError as exc:
                form.add_config_errors(exc.errors)
            else:
                messages.success(request, f"Run #{run.pk} created; placing its learners.")
                return redirect("training-run", pk=run.pk)
        return render(request, "training/run_form.html", {"form": form}, status=400)


class JobListView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return self._render(request, ProbeJobForm())

    def post(self, request: HttpRequest) -> HttpResponse:
        if not shared_writer(request.user):  # a probe runs on a shared cluster: platform operators
            raise PermissionDenied("probe jobs are dispatched by platform operators")
        form = ProbeJobForm(request.POST)
        if form.is_valid():
            try:
                job = probe_job_create(
                    cluster=form.cleaned_data["cluster"],
                    created_by=request.user,  # type: ignore[arg-type]
                    steps=form.cleaned_data["steps"],
                )
            except DispatchError as exc:
                form.add_error("cluster", str(exc))
            else:
                messages.success(request, f"Probe job #{job.pk} queued on {job.cluster.queue}.")
                return HttpResponseRedirect(reverse("job-detail", args=[job.pk]))
        return self._render(request, form, status=400)

    def _render(self, request: HttpRequest, form: ProbeJobForm, status: int = 200) -> HttpResponse:
        return render(
            request,
            "training/jobs.html",
            {
                "jobs": probe_jobs_recent(limit=100),
                "form": form,
                "can_write": shared_writer(request.user),
            },
            status=status,
        )


class JobDetailView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        job = get_object_or_404(ProbeJob.objects.select_related("cluster", "created_by"), pk=pk)
        chart = loss_curve_chart(job.loss_curve, f"Probe #{job.pk} loss") if job.loss_curve else ""
        return render(
            request,
            "training/job_detail.html",
            {
                "job": job,
                "chart": chart,
                # The job's ledger rows (unit prices, amounts): only for those who may see costs,
                # and for platform roles (a probe's spend belongs to no team).
                "usage": usage_for_subject(subject_type="probe_job", subject_id=str(job.pk))
                if principal_of_user(request.user).cost_teams is None
                else None,
                "can_see_costs": principal_of_user(request.user).cost_teams is None,
            },
        )


# --- API tokens ---------------------------------------------------------------------------------
