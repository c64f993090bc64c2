"""Role checks for API endpoints.

Each view may declare `read_roles` and `write_roles` (sets of stack.registry.roles.Role);
by default every role may read and operators may write. Admins may do anything.
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from stack.registry.roles import ALL_ROLES, OPERATORS, user_has_role


class RolePermission(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        if request.method in permissions.SAFE_METHODS:
            allowed = getattr(view, "read_roles", ALL_ROLES)
        else:
            allowed = getattr(view, "write_roles", OPERATORS)
        return user_has_role(request.user, frozenset(allowed))
