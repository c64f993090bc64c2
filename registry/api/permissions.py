"""Role checks for API endpoints.

Each view may declare `read_roles` and `write_roles` (sets of registry.auth.roles.Role);
by default every role may read and operators may write. Admins may do anything. A token limited
to workflows may use only the views that say how their rows belong to a workflow, and a
team-scoped caller only the views that say how their rows belong to a team or that they are
shared (registry.auth.scoping); it changes a row only with a writing role in the row's team.
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from registry.auth.access import request_workflow_scope
from registry.auth.principal import principal_of
from registry.auth.roles import ALL_ROLES, OPERATORS
from registry.auth.scoping import (
    LIMITED_TOKEN_MESSAGE,
    TEAM_SCOPED_MESSAGE,
    request_scope_teams,
    team_scope_queryset,
    view_declares_teams,
    view_refuses_limited_tokens,
    view_team_owned,
)
from registry.auth.teams import request_team_scope


class RolePermission(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        if request.method in permissions.SAFE_METHODS:
            allowed = getattr(view, "read_roles", ALL_ROLES)
        else:
            allowed = getattr(view, "write_roles", OPERATORS)
        if not principal_of(request).has_role_somewhere(frozenset(allowed)):
            return False
        if request_workflow_scope(request) is not None and view_refuses_limited_tokens(view):
            # Set per instance: DRF makes the permission objects anew for every request.
            self.message = f"{LIMITED_TOKEN_MESSAGE}; this endpoint holds no workflow's data"
            return False
        if request_team_scope(request) is not None:
            safe = request.method in permissions.SAFE_METHODS
            if not view_declares_teams(view) or not (safe or view_team_owned(view)):
                # Shared objects (clusters, providers, prices) are read by team members and
                # changed by platform admins; a view that says nothing of teams is closed.
                self.message = TEAM_SCOPED_MESSAGE
                return False
        return True

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        if request.method in permissions.SAFE_METHODS or request_team_scope(request) is None:
            return True
        # The row was found in the caller's teams (the filter's read scope); changing it needs a
        # writing role in the row's own team.
        write_roles = frozenset(getattr(view, "write_roles", OPERATORS))
        teams = request_scope_teams(request, write_roles)
        rows = team_scope_queryset(type(obj)._default_manager.filter(pk=obj.pk), request, view, teams=teams)
        if not rows.exists():
            self.message = "Your role in this object's team does not allow this"
            return False
        return True
