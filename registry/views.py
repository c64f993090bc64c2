"""Registry pages: generic list and form pages, providers and workflows (the API keys page is
stack.keys_page: it makes a budget too).

`RoleRequiredMixin` is the page-side role check that every app's pages use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views import View
from django.views.generic import CreateView, ListView, UpdateView

from registry import services
from registry.auth.fields import form_fields_restrict
from registry.auth.principal import can_see_costs, principal_of_user
from registry.auth.roles import ALL_ROLES, OPERATORS, Role
from registry.auth.teams import (
    team_slugs,
    teams_visible,
    user_may_change_team_object,
    user_teams_with_role,
)
from registry.forms import (
    ClusterForm,
    DeploymentForm,
    ProviderForm,
    RegisteredModelForm,
    SwitchPrimaryForm,
    TeamFilterForm,
    WorkflowForm,
    WorkflowRetentionForm,
)
from registry.models import Cluster, Deployment, Provider, RegisteredModel, Workflow
from registry.selectors import (
    get_workflow_for_user,
    workflow_current_policy,
    workflows_visible,
)


class RoleRequiredMixin(LoginRequiredMixin):
    """Pages: every role may look; `write_roles` may change things (POST).

    A team member passes the role check with what its teams grant; the page then shows only its
    teams' rows (registry.auth.teams). `platform_only` pages (the audit trail, reconciliation,
    forms that change shared objects) answer 403 to team-scoped users."""

    read_roles: frozenset[Role] = ALL_ROLES
    write_roles: frozenset[Role] = OPERATORS
    platform_only = False

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if not request.user.is_authenticated:
            return self.handle_no_permission()
        allowed = self.read_roles if request.method in ("GET", "HEAD") else self.write_roles
        principal = principal_of_user(request.user)
        if not principal.has_role_somewhere(allowed):
            raise PermissionDenied("your role does not allow this")
        if self.platform_only and principal.teams_with(allowed) is not None:
            # Every team's rows: the role must be a global one (a role in a team is not).
            raise PermissionDenied("this page is for platform roles")
        return super().dispatch(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)  # type: ignore[misc]
        principal = principal_of_user(self.request.user)  # type: ignore[attr-defined]
        writes = principal.teams_with(self.write_roles)
        context["can_write"] = writes is None if self.platform_only else writes != frozenset()
        return context


def require_team_write(user: Any, team_id: int | None, allowed: frozenset[Role] = OPERATORS) -> None:
    """403 unless `user` may change an object of team `team_id` (registry.auth.teams)."""
    if not user_may_change_team_object(user, team_id, allowed):
        raise PermissionDenied("your role in this object's team does not allow this")


def shared_writer(user: Any, allowed: frozenset[Role] = OPERATORS) -> bool:
    """May `user` change shared objects (clusters, providers, models, deployments, prices)?
    Platform roles only: a team role never reaches what every team shares."""
    return principal_of_user(user).may(allowed, None)


@dataclass(frozen=True)
class TeamFilter:
    """The `?team=` selector of a dashboard, validated: `slugs` is what ledger rows are filtered
    by (None: every team's and the platform's), `status` 400 when the choice was refused."""

    form: TeamFilterForm
    teams: frozenset[int] | None
    slugs: frozenset[str] | None
    status: int
    picked: str = ""  # the slug chosen with ?team=, for links to the rows behind a figure


def team_filter_from_request(request: HttpRequest, allowed: frozenset[Role] = ALL_ROLES) -> TeamFilter:
    """The teams a dashboard shows: the one picked with ?team= among those in which the caller
    holds one of `allowed` (LEDGER_READERS for a page of money), else all of those. An unknown
    or hidden team is a form error and the page shows the default."""
    scope = user_teams_with_role(request.user, allowed)
    bound = "team" in request.GET
    form = TeamFilterForm(request.GET if bound else None, teams=teams_visible(teams=scope))
    if bound and form.is_valid() and form.cleaned_data.get("team") is not None:
        team = form.cleaned_data["team"]
        return TeamFilter(form, frozenset({team.pk}), frozenset({team.slug}), 200, team.slug)
    return TeamFilter(form, scope, team_slugs(scope), 400 if bound and not form.is_valid() else 200)


def money_team_slugs(user: Any, teams: frozenset[int] | None) -> frozenset[str] | None:
    """The slugs of the teams among `teams` (None: every team) whose money `user` sees: what a
    page of spend filters ledger rows by. None: every team's and the platform's rows."""
    cost_teams = principal_of_user(user).cost_teams
    if cost_teams is None:
        return team_slugs(teams)
    return team_slugs(cost_teams if teams is None else teams & cost_teams)


# --- Registry: generic list and form pages ---------------------------------------------


class RegistryListView(RoleRequiredMixin, ListView[Any]):
    template_name = "stack/registry_list.html"
    title = ""
    columns: list[tuple[str, str]] = []  # (attribute, heading)
    create_url_name = ""
    edit_url_name = ""
    # Registry rows link to an edit form that only writers may open; workflow
    # rows link to a page every role may read.
    link_needs_write = True

    def get_queryset(self) -> Any:
        if self.model is Workflow:  # a team's workflows; the rest of the registry is shared
            return workflows_visible(user=self.request.user).select_related("owner", "team")
        return super().get_queryset()

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        if self.model is not Workflow:
            context["can_write"] = shared_writer(self.request.user, self.write_roles)
        context["title"] = self.title
        context["headings"] = [h for _, h in self.columns]
        show_links = bool(self.edit_url_name) and (context["can_write"] or not self.link_needs_write)
        context["rows"] = [
            {
                "cells": [_display(obj, attr) for attr, _ in self.columns],
                "edit_url": reverse(self.edit_url_name, args=[obj.slug]) if show_links else "",
                "obj": obj,
            }
            for obj in context["object_list"]
        ]
        context["create_url"] = reverse(self.create_url_name) if self.create_url_name else ""
        return context


def _display(obj: models.Model, attr: str) -> Any:
    display = getattr(obj, f"get_{attr}_display", None)
    value = display() if callable(display) else getattr(obj, attr)
    return "—" if value in (None, "") else value


class RegistryFormMixin(RoleRequiredMixin):
    template_name: str | None = "stack/registry_form.html"
    title = ""
    success_url_name = ""
    read_roles = OPERATORS  # the form pages exist to change things
    platform_only = True  # shared objects; the workflow form says otherwise

    def get_success_url(self) -> str:
        return reverse(self.success_url_name)

    def form_valid(self, form: Any) -> HttpResponse:
        """Save through the form's service; a refusal is the form again, with its error."""
        try:
            response: HttpResponse = super().form_valid(form)  # type: ignore[misc]
        except services.RegistryError as exc:
            form.add_refusal(exc)  # a ServiceModelForm's: the messages on their fields
            return self.form_invalid(form)  # type: ignore[attr-defined,no-any-return]
        return response

    def get_form(self, form_class: Any = None) -> Any:
        """The form, without the fields the caller's role may not set (registry.auth.fields)."""
        form = super().get_form(form_class)  # type: ignore[misc]
        form_fields_restrict(form, principal_of_user(self.request.user))  # type: ignore[attr-defined]
        return form

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["title"] = self.title
        return context


class RegistryCreateView(RegistryFormMixin, CreateView[Any, ModelForm[Any]]):
    """The create form of a registry object (model and form given in web_urls)."""


class RegistryUpdateView(RegistryFormMixin, UpdateView[Any, ModelForm[Any]]):
    slug_field = "slug"
    slug_url_kwarg = "slug"


class ProviderCreateView(RegistryCreateView):
    model = Provider
    form_class = ProviderForm
    title = "New provider"
    success_url_name = "providers"
    read_roles = write_roles = frozenset({Role.ADMIN})


class ProviderUpdateView(RegistryUpdateView):
    model = Provider
    form_class = ProviderForm
    title = "Edit provider"
    success_url_name = "providers"
    read_roles = write_roles = frozenset({Role.ADMIN})

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["note"] = (
            "Credentials are stored (encrypted)." if self.object.has_credentials else "No credentials stored."
        )
        return context


# --- Workflows ----------------------------------------------------------------------------


class WorkflowCreateView(RegistryCreateView):
    model = Workflow
    form_class = WorkflowForm
    title = "New workflow"
    success_url_name = "workflows"
    platform_only = False  # a team operator creates workflows in its teams

    def get_form_kwargs(self) -> dict[str, Any]:
        kwargs = super().get_form_kwargs()
        writable = user_teams_with_role(self.request.user, OPERATORS)
        kwargs["teams"] = teams_visible(teams=writable)
        kwargs["team_required"] = writable is not None  # a team-scoped author names a team
        return kwargs

    def form_valid(self, form: WorkflowForm) -> HttpResponse:  # type: ignore[override]
        try:
            workflow = services.workflow_create(
                slug=form.cleaned_data["slug"],
                owner=self.request.user,  # type: ignore[arg-type]
                team=form.cleaned_data["team"],
                description=form.cleaned_data["description"],
                deployments=list(form.cleaned_data["deployments"]),
                rpm_limit=form.cleaned_data["rpm_limit"],
                tpm_limit=form.cleaned_data["tpm_limit"],
                retain_prompts=form.cleaned_data["retain_prompts"],
                prompt_retention_days=form.cleaned_data["prompt_retention_days"],
            )
        except services.RegistryError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            return self.form_invalid(form)
        return HttpResponseRedirect(reverse("workflow-page", args=[workflow.slug]))


class WorkflowDetailView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest, slug: str) -> HttpResponse:
        workflow = get_workflow_for_user(slug=slug, user=request.user)
        return self._render(request, workflow, SwitchPrimaryForm())

    def post(self, request: HttpRequest, slug: str) -> HttpResponse:
        workflow = get_workflow_for_user(slug=slug, user=request.user)
        require_team_write(request.user, workflow.team_id)
        if request.POST.get("action") == "retention":
            return self._retention(request, workflow)
        form = SwitchPrimaryForm(request.POST)
        if form.is_valid():
            try:
                policy = services.workflow_switch_primary(
                    workflow=workflow,
                    deployment=form.cleaned_data["deployment"],
                    author=request.user,  # type: ignore[arg-type]
                    reason=form.cleaned_data["reason"],
                )
            except services.RegistryError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                messages.success(
                    request,
                    f"Primary is now {form.cleaned_data['deployment'].slug} (policy v{policy.version}).",
                )
                return HttpResponseRedirect(reverse("workflow-page", args=[workflow.slug]))
        return self._render(request, workflow, form, status=400)

    def _retention(self, request: HttpRequest, workflow: Workflow) -> HttpResponse:
        retention = WorkflowRetentionForm(request.POST)
        if retention.is_valid():
            data = retention.cleaned_data
            # Left out: kept as they are (a form of an older page, a client posting retention only).
            cache = {
                k: getattr(workflow, k) if data[k] is None else data[k]
                for k in ("response_cache_seconds", "response_cache_entries")
            }
            # Semantic fields: only a change is passed on (the rest saves while the embedder is off).
            semantic = {
                k: data[k]
                for k in ("semantic_cache_threshold", "semantic_cache_deployment")
                if k in request.POST and data[k] != getattr(workflow, k)
            }
            try:
                with transaction.atomic():
                    # One update checked as a whole (retention, cache and semantic matching depend
                    # on each other); opting out of keeping prompts deletes the kept ones.
                    services.workflow_update(
                        workflow,
                        retain_prompts=data["retain_prompts"],
                        prompt_retention_days=data["prompt_retention_days"],
                        **cache,
                        **semantic,
                    )
            except services.RegistryError as exc:
                retention.add_error(exc.field if exc.field in retention.fields else None, str(exc))
                return self._render(request, workflow, SwitchPrimaryForm(), status=400, retention=retention)
            if workflow.retain_prompts:
                messages.success(request, f"Prompts are kept for {workflow.prompt_retention_days} days.")
            else:
                messages.success(request, "Prompts are not kept; the kept ones were deleted.")
            return HttpResponseRedirect(reverse("workflow-page", args=[workflow.slug]))
        return self._render(request, workflow, SwitchPrimaryForm(), status=400, retention=retention)

    def _render(
        self,
        request: HttpRequest,
        workflow: Workflow,
        form: SwitchPrimaryForm,
        status: int = 200,
        retention: WorkflowRetentionForm | None = None,
    ) -> HttpResponse:
        versions = workflow.policy_versions.select_related("author").prefetch_related("entries__deployment")
        return render(
            request,
            "stack/workflow_detail.html",
            {
                "workflow": workflow,
                "policy": workflow_current_policy(workflow=workflow),
                "versions": versions,
                "form": form,
                "retention_form": retention
                or WorkflowRetentionForm(
                    initial={
                        "retain_prompts": workflow.retain_prompts,
                        "prompt_retention_days": workflow.prompt_retention_days,
                        "response_cache_seconds": workflow.response_cache_seconds,
                        "response_cache_entries": workflow.response_cache_entries,
                        "semantic_cache_threshold": workflow.semantic_cache_threshold,
                        "semantic_cache_deployment": workflow.semantic_cache_deployment,
                    }
                ),
                "can_write": user_may_change_team_object(request.user, workflow.team_id),
                "can_see_costs": can_see_costs(request.user, workflow.team_id),
            },
            status=status,
        )


# --- Jobs -------------------------------------------------------------------------------------


# --- Health and static assets ---------------------------------------------------------------------


REGISTRY_PAGES: dict[str, dict[str, Any]] = {
    "providers": {
        "model": Provider,
        "form": ProviderForm,
        "columns": [
            ("slug", "Slug"),
            ("display_name", "Name"),
            ("kind", "Kind"),
            ("region", "Region"),
            ("has_credentials", "Credentials"),
            ("enabled", "Enabled"),
        ],
    },
    "clusters": {
        "model": Cluster,
        "form": ClusterForm,
        "columns": [
            ("slug", "Slug"),
            ("provider", "Provider"),
            ("region", "Region"),
            ("accelerator_type", "Accelerator"),
            ("accelerator_count", "Count"),
            ("capacity_type", "Capacity type"),
            ("capacity", "Learners"),
            ("queue", "Queue"),
            ("status", "Status"),
            ("last_heartbeat_at", "Last heartbeat"),
        ],
    },
    "models": {
        "model": RegisteredModel,
        "form": RegisteredModelForm,
        "columns": [
            ("slug", "Slug"),
            ("family", "Family"),
            ("parameter_count", "Parameters"),
            ("artifact_uri", "Artifact"),
            ("context_length", "Context"),
        ],
    },
    "deployments": {
        "model": Deployment,
        "form": DeploymentForm,
        "columns": [
            ("slug", "Slug"),
            ("model", "Model"),
            ("provider", "Provider"),
            ("provider_model_id", "Provider model id"),
            ("base_url", "Base URL"),
            ("enabled", "Enabled"),
        ],
    },
}
