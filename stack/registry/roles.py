"""Roles: viewer, operator, admin, auditor, held as Django groups of those names.

A superuser is an admin. Admin may do everything; the other roles are granted
per endpoint through `read_roles` / `write_roles` on views (see
stack.registry.permissions.RolePermission).
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
# limits); a viewer sees none of them. `can_see_costs` is the only place that decides it.
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


def user_roles(user: User | AnonymousUser) -> frozenset[Role]:
    """The roles a user holds somewhere: its global roles, or, for a user with team memberships
    only, what those grant in any of its teams. Which rows a role reaches is the teams' rule
    (stack.registry.teams), applied to every query the caller makes."""
    roles = global_roles(user)
    if roles or not user.is_authenticated:
        return roles
    from stack.registry.teams import user_team_roles  # the teams module imports this one

    return frozenset().union(*user_team_roles(user).values())


def user_has_role(user: User | AnonymousUser, allowed: frozenset[Role]) -> bool:
    roles = user_roles(user)
    return Role.ADMIN in roles or bool(roles & allowed)


def roles_see_costs(roles: frozenset[Role]) -> bool:
    """May a caller holding `roles` see money figures? (The rule of `can_see_costs`.)"""
    return Role.ADMIN in roles or bool(roles & COST_READERS)


def can_see_costs(user: User | AnonymousUser) -> bool:
    """May this user see costs, prices, spend, budgets and money limits anywhere?"""
    return roles_see_costs(user_roles(user))
