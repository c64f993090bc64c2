"""Role checks for API endpoints.

Each view may declare `read_roles` and `write_roles` (sets of stack.registry.roles.Role);
by default every role may read and operators may write. Admins may do anything. A token limited
to workflows may use only the views that say how their rows belong to a workflow
(stack.registry.scoping).
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from stack.registry.access import request_workflow_scope
from stack.registry.roles import ALL_ROLES, OPERATORS, user_has_role
from stack.registry.scoping import LIMITED_TOKEN_MESSAGE, view_refuses_limited_tokens


class RolePermission(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        if request.method in permissions.SAFE_METHODS:
            allowed = getattr(view, "read_roles", ALL_ROLES)
        else:
            allowed = getattr(view, "write_roles", OPERATORS)
        if not user_has_role(request.user, frozenset(allowed)):
            return False
        if request_workflow_scope(request) is not None and view_refuses_limited_tokens(view):
            # Set per instance: DRF makes the permission objects anew for every request.
            self.message = f"{LIMITED_TOKEN_MESSAGE}; this endpoint holds no workflow's data"
            return False
        return True
