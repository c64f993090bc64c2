"""Team memberships: set and remove a user's role in a team."""

from __future__ import annotations

from django.contrib.auth.models import User

from registry.auth.roles import Role
from registry.models import (
    Team,
    TeamMembership,
)
from registry.services.errors import RegistryError


def team_membership_set(*, team: Team, user: User, role: str) -> TeamMembership:
    """Make `user` a member of `team` with `role`, or change the role of a member. A row set
    here is a manual one (a later single-sign-on login does not rewrite it)."""
    if role not in Role.values:
        raise RegistryError(f"unknown role {role!r}; one of {', '.join(Role.values)}", field="role")
    membership, _ = TeamMembership.objects.update_or_create(
        team=team, user=user, defaults={"role": role, "source": "manual"}
    )
    return membership


def team_membership_remove(*, team: Team, user: User) -> bool:
    """Take `user` out of `team`; False when they were not a member."""
    deleted, _ = TeamMembership.objects.filter(team=team, user=user).delete()
    return deleted > 0
