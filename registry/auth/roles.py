"""Roles: viewer, operator, admin, auditor, held as Django groups of those names.

A superuser is an admin. Admin may do everything; the other roles are granted
per endpoint through `read_roles` / `write_roles` on views (see
registry.api.permissions.RolePermission). Which roles a caller holds over an object of a team
is registry.auth.principal's rule (global roles plus the role held in that team).
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    OPERATOR = "operator", "Operator"
    ADMIN = "admin", "Admin"
    AUDITOR = "auditor", "Auditor"


ALL_ROLES = frozenset(Role)
OPERATORS = frozenset({Role.OPERATOR, Role.ADMIN})
ADMINS = frozenset({Role.ADMIN})
# Who may read ledger rows and unit prices (the ledger, price and export APIs and pages).
LEDGER_READERS = frozenset({Role.AUDITOR, Role.OPERATOR, Role.ADMIN})
# Who may see money at all. One rule for pages, API answers, charts and the gateway's headers:
# whoever may read the ledger may see every figure derived from it (costs, prices, spend, budgets,
# limits) in the object's team; a viewer sees none of them. `Principal.sees_costs` (registry.auth.principal)
# is the only place that decides it.
COST_READERS = LEDGER_READERS


def global_roles(user: User | AnonymousUser) -> frozenset[Role]:
    """The roles a user holds on every team (Django groups; a superuser is an admin)."""
    if not user.is_authenticated:
        return frozenset()
    if getattr(user, "is_superuser", False):
        return frozenset({Role.ADMIN})
    cached = getattr(user, "_switchyard_roles", None)
    if cached is None:
        names = set(user.groups.values_list("name", flat=True))
        cached = frozenset(r for r in Role if r.value in names)
        setattr(user, "_switchyard_roles", cached)  # noqa: B010 (per-request cache on the user object)
    return cached
