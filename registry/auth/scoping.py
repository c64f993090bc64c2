"""A token limited to workflows reaches those workflows' data and nothing else, and a
team-scoped caller its teams' data and nothing else, on every API endpoint (the /v1 gateway
asks registry.auth.access itself; who is team-scoped is registry.auth.teams' rule).

Teams: a view whose rows belong to a workflow is scoped to the caller's teams through that
workflow (`workflow_field` + "__team"); a view whose rows belong to a team otherwise declares
`team_field` (the lookup to the Team) or `team_scope_queryset(queryset, teams)`; a view of
shared objects (clusters, providers, prices) declares `shared_with_teams = True`, and
team-scoped callers may read it but never change it; a view for platform-wide roles only (the
audit trail, invoice reconciliation) says so with `platform_only = True`. A view that declares
none of these is closed to team-scoped callers (403) like a platform-only one: an endpoint added
later stays closed until it says how its rows belong to a team (tests/stack/test_team_scoping.py
walks every /api/ route for a declaration). A caller reads a team's rows when its role in that
team is one of the view's `read_roles` (a viewer of team B reads no ledger rows of B, even as
an operator of team A), and writes need a writing role in the row's own team (403 otherwise).

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

from registry.auth.access import request_workflow_scope
from registry.auth.roles import ALL_ROLES, OPERATORS, Role
from registry.auth.teams import filter_by_team, request_team_scope, request_teams_with_role
from registry.models import Team, Workflow
from registry.selectors import workflows_visible

LIMITED_TOKEN_MESSAGE = "This API token is limited to workflows"  # noqa: S105 (a message, not a secret)
TEAM_SCOPED_MESSAGE = "Your roles are in teams; this endpoint is for platform-wide roles"
M = TypeVar("M", bound=Model)

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_scope_teams(request: Any, write_roles: frozenset[Role] = OPERATORS) -> frozenset[int] | None:
    """The teams a request's rows may belong to: those it may read for a safe method, those in
    which it holds a writing role otherwise. None: every team."""
    if getattr(request, "method", "GET") in _SAFE_METHODS:
        return request_team_scope(request)
    return request_teams_with_role(request, write_roles)


def workflows_visible_to(request: Any) -> QuerySet[Workflow]:
    """The workflows this request may see: every one for a platform-wide role, its teams' for a
    team-scoped caller, only its own for a token limited to workflows, none without a role."""
    return workflows_visible(
        user=request.user, workflow_ids=request_workflow_scope(request), teams=request_team_scope(request)
    )


def workflow_team_lookup(workflow_field: str) -> str:
    """The lookup from a row to its workflow's team."""
    return "team" if workflow_field == "pk" else f"{workflow_field}__team"


def scope_queryset(
    queryset: QuerySet[M], request: Any, workflow_field: str, *, write_roles: frozenset[Role] = OPERATORS
) -> QuerySet[M]:
    """`queryset` less the rows of workflows a limited token may not reach and of teams the
    caller is not in (for a write: teams in which it may not write)."""
    scope = request_workflow_scope(request)
    if scope is not None:
        queryset = queryset.filter(**{f"{workflow_field}__in": scope})
    return filter_by_team(
        queryset, request_scope_teams(request, write_roles), workflow_team_lookup(workflow_field)
    )


def team_scope_queryset(
    queryset: QuerySet[Any], request: Any, view: Any, *, teams: frozenset[int] | None | bool = True
) -> QuerySet[Any]:
    """The rows of `queryset` in `teams` (by default the teams in which the caller holds one of
    the view's read roles: the write role is checked per object,
    RolePermission.has_object_permission) through `view`'s rule.
    A view's own `team_scope_queryset(queryset, teams)` gets the team ids (never None)."""
    if teams is True:
        teams = request_teams_with_role(request, frozenset(getattr(view, "read_roles", ALL_ROLES)))
    if teams is None or isinstance(teams, bool):
        return queryset
    custom = getattr(view, "team_scope_queryset", None)
    if custom is not None:
        return custom(queryset, teams)  # type: ignore[no-any-return]
    team_field = getattr(view, "team_field", None)
    if team_field is None and getattr(view, "workflow_field", None) is not None:
        team_field = workflow_team_lookup(view.workflow_field)
    if team_field is not None:
        return filter_by_team(queryset, teams, team_field)
    if getattr(view, "shared_with_teams", False):
        return queryset
    return queryset.none()  # RolePermission refused the request already


def view_declares_teams(view: Any) -> bool:
    """Does this view say how its rows belong to a team (or that they are shared)? A
    platform-only view does not, whatever else it declares."""
    if getattr(view, "platform_only", False):
        return False
    return any(
        getattr(view, name, None) is not None
        for name in ("team_field", "workflow_field", "team_scope_queryset")
    ) or getattr(view, "shared_with_teams", False)


def view_team_rule(view: Any) -> str | None:
    """How this view's rows belong to teams, as it declares it: "team_scope_queryset",
    "team_field", "workflow_field", "shared" or "platform_only"; None: it says nothing (and is
    closed to team-scoped callers all the same)."""
    for name in ("team_scope_queryset", "team_field", "workflow_field"):
        if getattr(view, name, None) is not None:
            return name
    if getattr(view, "shared_with_teams", False):
        return "shared"
    if getattr(view, "platform_only", False):
        return "platform_only"
    return None


def view_team_owned(view: Any) -> bool:
    """Do this view's rows belong to teams (so team members may change them)?"""
    return view_declares_teams(view) and not getattr(view, "shared_with_teams", False)


def scope_requires_workflow(request: Any, workflow: Workflow | None, *, field: str = "workflow") -> None:
    """A limited token may only act on one of its workflows: naming none is a 400."""
    if workflow is None and request_workflow_scope(request) is not None:
        raise serializers.ValidationError({field: [f"{LIMITED_TOKEN_MESSAGE}: name one of them"]})


def scope_requires_team_workflow(request: Any, workflow: Workflow | None, *, field: str = "workflow") -> None:
    """A team-scoped caller acts on its teams' workflows: an input that may name no workflow at
    all (feedback on a bare deployment moves its quality for every team) needs one (400)."""
    if workflow is None and request_team_scope(request) is not None:
        raise serializers.ValidationError({field: ["Name one of your teams' workflows"]})


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
    """Keeps the rows of a limited token's workflows and of a team-scoped caller's teams
    (REST_FRAMEWORK's DEFAULT_FILTER_BACKENDS).

    A view whose rows name their workflow some other way (an export job's stored filters)
    defines `workflow_scope_queryset(queryset, request)` instead of `workflow_field`."""

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> QuerySet[Any]:
        queryset = team_scope_queryset(queryset, request, view)
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
        write_roles = getattr(self.context.get("view"), "write_roles", OPERATORS)  # type: ignore[attr-defined]
        return scope_queryset(queryset, request, self.workflow_field, write_roles=frozenset(write_roles))


class WorkflowScopedSlugRelatedField(_ScopedRelatedField, serializers.SlugRelatedField):  # type: ignore[type-arg]
    """A workflow (by default) or a workflow's row, by slug, among those the request may reach."""


class WorkflowScopedPrimaryKeyRelatedField(_ScopedRelatedField, serializers.PrimaryKeyRelatedField):  # type: ignore[type-arg]
    """A workflow's row by id, among those the request may reach."""


def scoped_workflow_field(**kwargs: Any) -> WorkflowScopedSlugRelatedField:
    """The `workflow` input of a serializer: a slug among the workflows the request may reach."""
    return WorkflowScopedSlugRelatedField(
        slug_field="slug", queryset=Workflow.objects.all(), workflow_field="pk", **kwargs
    )


class TeamSlugField(serializers.SlugRelatedField):  # type: ignore[type-arg]
    """A team by slug, among those in which the request may write (every team for a
    platform-wide caller); another team is "does not exist" (400), as one that does not."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("slug_field", "slug")
        kwargs.setdefault("queryset", Team.objects.all())
        super().__init__(**kwargs)

    def get_queryset(self) -> QuerySet[Any]:
        queryset: QuerySet[Any] = Team.objects.all()
        request = self.context.get("request")
        if request is None:
            raise ImproperlyConfigured("TeamSlugField needs the request in its serializer's context")
        write_roles = getattr(self.context.get("view"), "write_roles", OPERATORS)
        teams = request_scope_teams(request, frozenset(write_roles))
        return queryset if teams is None else queryset.filter(pk__in=teams)


def scope_requires_team(request: Any, team: Team | None, *, field: str = "team") -> None:
    """A team-scoped caller's new object belongs to one of its teams: naming none is a 400."""
    if team is None and request_team_scope(request) is not None:
        raise serializers.ValidationError({field: ["Name one of your teams"]})
