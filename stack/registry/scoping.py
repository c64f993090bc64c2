"""A token limited to workflows reaches those workflows' data and nothing else, on every API
endpoint (the /v1 gateway asks stack.registry.access itself).

One rule, applied in three places that every endpoint goes through:

- Which endpoints: a view says how its rows belong to a workflow with `workflow_field` (the
  lookup from its model to the workflow: "workflow", "eval_set__workflow", "pk" for workflows
  themselves). RolePermission refuses a limited token with 403 on every view that does not say
  so (clusters, providers, prices, training runs...): such a token has no business there, and an
  endpoint added later is closed to it until it declares how it is scoped.
- Which rows: WorkflowScopeFilter (a default filter backend, so every list and every
  `get_object` goes through it) keeps the rows of the token's workflows; another workflow's row
  answers 404, as a row that does not exist.
- Which inputs: the serializer fields that name a workflow, or a row that belongs to one, are
  `WorkflowScopedSlugRelatedField` / `WorkflowScopedPrimaryKeyRelatedField`: another workflow is
  "does not exist" (400), never created or changed. Inputs that may name no workflow at all (a
  provider's budget, feedback on a bare deployment) call `scope_requires_workflow`.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model, QuerySet
from rest_framework import exceptions, serializers
from rest_framework.filters import BaseFilterBackend
from rest_framework.request import Request

from stack.registry.access import request_workflow_scope
from stack.registry.models import Workflow
from stack.registry.selectors import workflows_visible

LIMITED_TOKEN_MESSAGE = "This API token is limited to workflows"  # noqa: S105 (a message, not a secret)
M = TypeVar("M", bound=Model)


def workflows_visible_to(request: Any) -> QuerySet[Workflow]:
    """The workflows this request may see: every one for any role, only its own for a token
    limited to workflows, none without a role."""
    return workflows_visible(user=request.user, workflow_ids=request_workflow_scope(request))


def scope_queryset(queryset: QuerySet[M], request: Any, workflow_field: str) -> QuerySet[M]:
    """`queryset` less the rows of workflows a limited token may not reach."""
    scope = request_workflow_scope(request)
    if scope is None:
        return queryset
    return queryset.filter(**{f"{workflow_field}__in": scope})


def scope_requires_workflow(request: Any, workflow: Workflow | None, *, field: str = "workflow") -> None:
    """A limited token may only act on one of its workflows: naming none is a 400."""
    if workflow is None and request_workflow_scope(request) is not None:
        raise serializers.ValidationError({field: [f"{LIMITED_TOKEN_MESSAGE}: name one of them"]})


def scope_refuses(request: Any, what: str) -> None:
    """Refuse (403) an action a limited token may not take at all, e.g. creating a workflow."""
    if request_workflow_scope(request) is not None:
        raise exceptions.PermissionDenied(f"{LIMITED_TOKEN_MESSAGE}; it may not {what}")


def visible_workflow_slugs(request: Any) -> frozenset[str] | None:
    """The slugs of a limited token's workflows; None when the request is not limited."""
    if request_workflow_scope(request) is None:
        return None
    return frozenset(workflows_visible_to(request).values_list("slug", flat=True))


def view_refuses_limited_tokens(view: Any) -> bool:
    """Does this view hold no workflow's data (so a limited token may not use it)?"""
    return getattr(view, "workflow_field", None) is None and not hasattr(view, "workflow_scope_queryset")


class WorkflowScopeFilter(BaseFilterBackend):
    """Keeps the rows of a limited token's workflows (REST_FRAMEWORK's DEFAULT_FILTER_BACKENDS).

    A view whose rows name their workflow some other way (an export job's stored filters)
    defines `workflow_scope_queryset(queryset, request)` instead of `workflow_field`."""

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> QuerySet[Any]:
        if request_workflow_scope(request) is None:
            return queryset
        custom = getattr(view, "workflow_scope_queryset", None)
        if custom is not None:
            return custom(queryset, request)  # type: ignore[no-any-return]
        field = getattr(view, "workflow_field", None)
        if field is None:
            return queryset.none()  # RolePermission refused the request already
        return scope_queryset(queryset, request, field)


class _ScopedRelatedField:
    """A related field whose choices are the rows of the workflows the request may reach."""

    workflow_field = "workflow"

    def __init__(self, *args: Any, workflow_field: str | None = None, **kwargs: Any) -> None:
        if workflow_field is not None:
            self.workflow_field = workflow_field
        super().__init__(*args, **kwargs)

    def get_queryset(self) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset()  # type: ignore[misc]
        request = self.context.get("request")  # type: ignore[attr-defined]
        if request is None:
            # Fail closed: an input that names a workflow's row needs to know who is asking.
            raise ImproperlyConfigured(
                f"{type(self).__name__} needs the request in its serializer's context "
                "(view.get_serializer, or context={'request': request})"
            )
        return scope_queryset(queryset, request, self.workflow_field)


class WorkflowScopedSlugRelatedField(_ScopedRelatedField, serializers.SlugRelatedField):  # type: ignore[type-arg]
    """A workflow (by default) or a workflow's row, by slug, among those the request may reach."""


class WorkflowScopedPrimaryKeyRelatedField(_ScopedRelatedField, serializers.PrimaryKeyRelatedField):  # type: ignore[type-arg]
    """A workflow's row by id, among those the request may reach."""


def scoped_workflow_field(**kwargs: Any) -> WorkflowScopedSlugRelatedField:
    """The `workflow` input of a serializer: a slug among the workflows the request may reach."""
    return WorkflowScopedSlugRelatedField(
        slug_field="slug", queryset=Workflow.objects.all(), workflow_field="pk", **kwargs
    )
