"""Inference pages: the deployments overview, a workflow's inference page, a provider's page."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views import View

from inference import charts
from inference.forms import ChaosForm, EvalRunForm
from inference.models import BatchJob, ChaosConfig, EvalRun, EvalSet
from inference.quality import services as quality
from inference.selectors import workflow_requests
from inference.services import chaos_config_set
from inference.stats_selectors import (
    deployment_stats,
    provider_deployment_stats,
    provider_totals,
    workflow_failovers,
    workflow_latency,
)
from registry.auth.principal import principal_of_user
from registry.auth.teams import user_may_change_team_object
from registry.models import Deployment, Provider, Workflow
from registry.selectors import get_workflow_for_user, workflow_current_policy, workflows_visible
from registry.services import RegistryError
from registry.views import RoleRequiredMixin, require_team_write, shared_writer


class InferenceHomeView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest) -> HttpResponse:
        principal = principal_of_user(request.user)
        stats = deployment_stats(teams=principal.visible_teams)
        # Figures summed over every team the caller reads: money only if it sees every one's.
        costs = principal.sees_costs_of_every_visible_team()
        return render(
            request,
            "inference/home.html",
            {
                "stats": stats,
                "can_see_costs": costs,
                # Its x axis is money: drawn only for those who may see costs.
                "chart": charts.cost_quality_chart(stats) if costs else None,
                "workflows": workflows_visible(user=request.user).order_by("slug"),
            },
        )


class WorkflowInferenceView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest, slug: str) -> HttpResponse:
        workflow = get_workflow_for_user(slug=slug, user=request.user)
        deployments = self._deployments(workflow)
        return self._render(request, workflow, deployments, ChaosForm(deployments=deployments))

    def post(self, request: HttpRequest, slug: str) -> HttpResponse:
        workflow = get_workflow_for_user(slug=slug, user=request.user)
        deployments = self._deployments(workflow)
        require_team_write(request.user, workflow.team_id)
        if request.POST.get("action") == "eval-run":
            return self._eval_run(request, workflow, deployments)
        if not shared_writer(request.user):
            # A drill fails a deployment every team's workflows share: platform operators only.
            raise PermissionDenied("chaos drills are set by platform operators")
        form = ChaosForm(request.POST, deployments=deployments)
        if form.is_valid():
            deployment = form.cleaned_data["deployment"]
            current = ChaosConfig.objects.filter(deployment=deployment).first()
            try:
                # Only the error rate and the switch come from this form; the other drill
                # settings (status codes, latency, malformed bodies) are kept as the API set them.
                chaos_config_set(
                    deployment=deployment,
                    enabled=form.cleaned_data["enabled"],
                    user=request.user,  # type: ignore[arg-type]
                    error_rate=form.cleaned_data["error_rate"],
                    status_codes=list(current.status_codes) if current else [],
                    latency_ms=current.latency_ms if current else 0,
                    malformed_rate=current.malformed_rate if current else 0.0,
                )
            except RegistryError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                state = "on" if form.cleaned_data["enabled"] else "off"
                messages.success(
                    request,
                    f"Chaos drill {state} for {deployment.slug} "
                    f"(error rate {form.cleaned_data['error_rate']:.2f}).",
                )
                return HttpResponseRedirect(reverse("inference-workflow", args=[workflow.slug]))
        return self._render(request, workflow, deployments, form, status=400)

    def _eval_run(
        self, request: HttpRequest, workflow: Workflow, deployments: list[Deployment]
    ) -> HttpResponse:
        eval_form = EvalRunForm(request.POST, workflow=workflow, deployments=deployments)
        if eval_form.is_valid():
            try:
                run = quality.eval_run_start(
                    eval_set=eval_form.cleaned_data["eval_set"],
                    deployment=eval_form.cleaned_data["deployment"],
                    user=request.user,
                )
            except RegistryError as exc:
                eval_form.add_error(exc.field if exc.field in eval_form.fields else None, str(exc))
            else:
                messages.success(
                    request, f"Eval run #{run.pk} of {run.eval_set.name} on {run.deployment.slug} queued."
                )
                return HttpResponseRedirect(reverse("inference-workflow", args=[workflow.slug]))
        return self._render(
            request,
            workflow,
            deployments,
            ChaosForm(deployments=deployments),
            eval_form=eval_form,
            status=400,
        )

    @staticmethod
    def _deployments(workflow: Workflow) -> list[Deployment]:
        policy = workflow_current_policy(workflow=workflow)
        return policy.ordered_deployments() if policy is not None else []

    def _render(
        self,
        request: HttpRequest,
        workflow: Workflow,
        deployments: list[Deployment],
        form: ChaosForm,
        eval_form: EvalRunForm | None = None,
        status: int = 200,
    ) -> HttpResponse:
        chaos = {c.deployment_id: c for c in ChaosConfig.objects.filter(deployment__in=deployments)}
        principal = principal_of_user(request.user)
        # The workflow's money is its team's: shown to that team's ledger readers, with the
        # deployments' figures summed over the teams whose money they see.
        costs = principal.sees_costs(workflow.team_id)
        teams = principal.cost_teams if costs else principal.visible_teams
        stats = deployment_stats(deployments=deployments, teams=teams)
        route = [(s, chaos.get(s.deployment.pk)) for s in stats]
        return render(
            request,
            "inference/workflow.html",
            {
                "workflow": workflow,
                "can_see_costs": costs,
                "policy": workflow_current_policy(workflow=workflow),
                "route": route,
                "latency": workflow_latency(workflow=workflow),
                "failovers": workflow_failovers(workflow=workflow),
                "requests": workflow_requests(workflow=workflow, limit=25),
                "form": form,
                "eval_form": eval_form or EvalRunForm(workflow=workflow, deployments=deployments),
                "eval_sets": EvalSet.objects.filter(workflow=workflow)
                .annotate(n_cases=Count("cases"))
                .order_by("name"),
                "eval_runs": EvalRun.objects.filter(eval_set__workflow=workflow)
                .select_related("eval_set", "deployment")
                .order_by("-created_at")[:20],
                # Batch jobs are created through the API; the page shows their progress.
                "batch_jobs": BatchJob.objects.filter(workflow=workflow).order_by("-created_at")[:20],
                "can_write": user_may_change_team_object(request.user, workflow.team_id),
                "can_drill": shared_writer(request.user),
            },
            status=status,
        )


class ProviderInferenceView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest, slug: str) -> HttpResponse:
        provider = get_object_or_404(Provider, slug=slug)
        principal = principal_of_user(request.user)
        stats = provider_deployment_stats(provider=provider, teams=principal.visible_teams)
        return render(
            request,
            "inference/provider.html",
            {
                "provider": provider,
                "stats": stats,
                "totals": provider_totals(stats),
                "can_see_costs": principal.sees_costs_of_every_visible_team(),
            },
        )
