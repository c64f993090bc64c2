"""Registry pages: generic list and form pages, providers and workflows (the API keys page is
stack.keys_page: it makes a budget too).

`RoleRequiredMixin` is the page-side role check that every app's pages use."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
from django.db import models
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views import View
from django.views.generic import CreateView, ListView, UpdateView

from stack.registry import services
from stack.registry.forms import (
    ClusterForm,
    DeploymentForm,
    ProviderForm,
    RegisteredModelForm,
    SwitchPrimaryForm,
    WorkflowForm,
)
from stack.registry.models import Cluster, Deployment, Provider, RegisteredModel, Workflow
from stack.registry.roles import ALL_ROLES, OPERATORS, Role, user_has_role
from stack.registry.selectors import get_workflow_for_user, workflow_current_policy


class RoleRequiredMixin(LoginRequiredMixin):
    """Pages: every role may look; `write_roles` may change things (POST)."""

    read_roles: frozenset[Role] = ALL_ROLES
    write_roles: frozenset[Role] = OPERATORS

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if not request.user.is_authenticated:
            return self.handle_no_permission()
        allowed = self.read_roles if request.method in ("GET", "HEAD") else self.write_roles
        if not user_has_role(request.user, allowed):
            raise PermissionDenied("your role does not allow this")
        return super().dispatch(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context: dict[str, Any] = super().get_context_data(**kwargs)  # type: ignore[misc]
        context["can_write"] = user_has_role(self.request.user, self.write_roles)  # type: ignore[attr-defined]
        return context


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

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
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

    def get_success_url(self) -> str:
        return reverse(self.success_url_name)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["title"] = self.title
        return context


class RegistryCreateView(RegistryFormMixin, CreateView[Any, ModelForm[Any]]):
    """The create form of a registry object (model and form given in web_urls)."""


class RegistryUpdateView(RegistryFormMixin, UpdateView[Any, ModelForm[Any]]):
    slug_field = "slug"
    slug_url_kwarg = "slug"


class ProviderFormMixin:
    def form_valid(self, form: Any) -> HttpResponse:
        response: HttpResponse = super().form_valid(form)  # type: ignore[misc]
        services.provider_set_credentials(provider=form.instance, credentials=form.credentials_change())
        return response


class ProviderCreateView(ProviderFormMixin, RegistryCreateView):
    model = Provider
    form_class = ProviderForm
    title = "New provider"
    success_url_name = "providers"
    read_roles = write_roles = frozenset({Role.ADMIN})


class ProviderUpdateView(ProviderFormMixin, RegistryUpdateView):
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
            )
        except services.RegistryError as exc:
            form.add_error(None, str(exc))
            return self.form_invalid(form)
        return HttpResponseRedirect(reverse("workflow-page", args=[workflow.slug]))


class WorkflowDetailView(RoleRequiredMixin, View):
    def get(self, request: HttpRequest, slug: str) -> HttpResponse:
        workflow = get_workflow_for_user(slug=slug, user=request.user)
        return self._render(request, workflow, SwitchPrimaryForm())

    def post(self, request: HttpRequest, slug: str) -> HttpResponse:
        workflow = get_workflow_for_user(slug=slug, user=request.user)
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

    def _render(
        self, request: HttpRequest, workflow: Workflow, form: SwitchPrimaryForm, status: int = 200
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
                "can_write": user_has_role(request.user, OPERATORS),
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
