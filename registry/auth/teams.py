"""Who sees which team's objects: the one rule behind every list, page, chart, export and API.

- A user holding a global role (a Django group, or a superuser) is platform-wide: every team's
  objects, as before teams existed. Platform admins and auditors are such users.
- A user with only team memberships is team-scoped: the objects of their teams and nothing
  else; another team's object answers 404, as one that does not exist. Shared objects
  (clusters, providers, models, deployments, prices) are read by everyone and changed by
  platform admins only.
- Within a team, the membership's role decides as a global role would: viewers read, operators
  change, auditors read the ledger, and the team's admin does all of that and manages the
  team's members and keys (but is no platform admin).
- A team's API key reaches its team only, whoever made it; a key with no team acts with its
  user's global roles only.

Every function here is a question asked of the caller's principal (registry.auth.principal):
roles are those held in the object's team, never a union across teams.

`request_team_scope` is what the API filters by (registry.auth.scoping), `user_team_scope` what
pages filter by; both answer None for "not limited".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Q, QuerySet

from registry.auth.principal import principal_of, principal_of_user, request_key
from registry.auth.roles import OPERATORS, Role
from registry.models import Team


def user_team_roles(user: User | AnonymousUser) -> Mapping[int, frozenset[Role]]:
    """team id -> the roles the user holds in it (a team admin as operator + auditor)."""
    return principal_of_user(user).team_roles


def user_team_admin_of(user: User | AnonymousUser) -> frozenset[int]:
    """The teams whose members and keys this user manages (admins of the team)."""
    return principal_of_user(user).team_admin_of


def user_is_platform_wide(user: User | AnonymousUser) -> bool:
    """Does a global role let this user see every team?"""
    return principal_of_user(user).platform_wide


def user_team_scope(user: User | AnonymousUser) -> frozenset[int] | None:
    """The teams this user may see; None for a platform-wide user (every team)."""
    return principal_of_user(user).visible_teams


def user_teams_with_role(user: User | AnonymousUser, allowed: frozenset[Role]) -> frozenset[int] | None:
    """The teams in which this user holds one of `allowed` (its global roles plus its role in
    that team); None when a global role grants it everywhere."""
    return principal_of_user(user).teams_with(allowed)


def request_token_team_id(request: Any) -> int | None:
    key = request_key(request)
    return key.team_id if key is not None else None


def request_team_scope(request: Any) -> frozenset[int] | None:
    """The teams this request may see (its principal's: a team key's team only)."""
    return principal_of(request).visible_teams


def request_teams_with_role(request: Any, allowed: frozenset[Role]) -> frozenset[int] | None:
    """The teams in which this request may act with one of `allowed` (e.g. OPERATORS to
    change); None: every team."""
    return principal_of(request).teams_with(allowed)


def request_team_admin_of(request: Any) -> frozenset[int] | None:
    """The teams whose settings and members this request may manage: every team (None) for a
    platform admin, else those its user administers, narrowed to its key's team for a team key."""
    return principal_of(request).managed_teams


def teams_visible(*, teams: frozenset[int] | None) -> QuerySet[Team]:
    rows = Team.objects.all()
    return rows if teams is None else rows.filter(pk__in=teams)


def team_slugs(teams: frozenset[int] | None) -> frozenset[str] | None:
    """The slugs of `teams` (what ledger rows and team budgets name); None stays None."""
    if teams is None:
        return None
    return frozenset(Team.objects.filter(pk__in=teams).values_list("slug", flat=True))


def filter_by_team(
    queryset: QuerySet[Any], teams: frozenset[int] | None, team_field: str, *, also: Q | None = None
) -> QuerySet[Any]:
    """`queryset` less the rows outside `teams` (`team_field` is the lookup to the Team, e.g.
    "workflow__team"); `also` admits more rows (e.g. a team budget named by slug)."""
    if teams is None:
        return queryset
    condition = Q(**{f"{team_field}__in": teams})
    return queryset.filter(condition | also if also is not None else condition)


def user_may_change_team_object(
    user: User | AnonymousUser, team_id: int | None, allowed: frozenset[Role] = OPERATORS
) -> bool:
    """May this user change an object of team `team_id` (None: a platform object)? A global role
    in `allowed` (or admin) changes any; a team-scoped user needs one of `allowed` in that very
    team, and never changes a platform object."""
    return principal_of_user(user).may(allowed, team_id)
