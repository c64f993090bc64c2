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
- A team's API key reaches its team only, whoever made it.

`request_team_scope` is what the API filters by (stack.registry.scoping), `user_team_scope` what
pages filter by; both answer None for "not limited".
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Q, QuerySet

from stack.registry.models import ApiToken, Team, TeamMembership
from stack.registry.roles import ALL_ROLES, OPERATORS, Role, global_roles

_TEAM_ROLES_ATTR = "_switchyard_team_roles"

# What a role in a team amounts to inside that team. A team admin is an operator and an auditor
# of it (it reads the team's ledger and changes its objects) and manages its members and keys;
# it never becomes a platform admin.
TEAM_ROLE_GRANTS: dict[str, frozenset[Role]] = {
    Role.VIEWER: frozenset({Role.VIEWER}),
    Role.OPERATOR: frozenset({Role.OPERATOR}),
    Role.AUDITOR: frozenset({Role.AUDITOR}),
    Role.ADMIN: frozenset({Role.OPERATOR, Role.AUDITOR}),
}


def user_team_roles(user: User | AnonymousUser) -> dict[int, frozenset[Role]]:
    """team id -> the roles the user holds in it (a team admin as operator + auditor). Cached
    on the user object, which lives for one request."""
    if not user.is_authenticated:
        return {}
    cached: dict[int, frozenset[Role]] | None = getattr(user, _TEAM_ROLES_ATTR, None)
    if cached is None:
        cached = {}
        for team_id, role in TeamMembership.objects.filter(user=user).values_list("team_id", "role"):
            cached[team_id] = cached.get(team_id, frozenset()) | TEAM_ROLE_GRANTS.get(role, frozenset())
        setattr(user, _TEAM_ROLES_ATTR, cached)
    return cached


def user_team_admin_of(user: User | AnonymousUser) -> frozenset[int]:
    """The teams whose members and keys this user manages (admins of the team)."""
    if not user.is_authenticated:
        return frozenset()
    return frozenset(
        TeamMembership.objects.filter(user=user, role=Role.ADMIN).values_list("team_id", flat=True)
    )


def user_is_platform_wide(user: User | AnonymousUser) -> bool:
    """Does a global role let this user see every team?"""
    return bool(global_roles(user))


def user_team_scope(user: User | AnonymousUser) -> frozenset[int] | None:
    """The teams this user may see; None for a platform-wide user (every team)."""
    if user_is_platform_wide(user):
        return None
    return frozenset(user_team_roles(user))


def user_teams_with_role(user: User | AnonymousUser, allowed: frozenset[Role]) -> frozenset[int] | None:
    """The teams in which this user holds one of `allowed`; None when a global role grants it
    everywhere (or the user is platform-wide: a global role that does not grant it grants it
    in no team, since team roles are for team-scoped users)."""
    if user_is_platform_wide(user):
        roles = global_roles(user)
        return None if (Role.ADMIN in roles or roles & allowed) else frozenset()
    return frozenset(team for team, roles in user_team_roles(user).items() if roles & allowed)


def request_token_team_id(request: Any) -> int | None:
    auth = getattr(request, "auth", None)
    return auth.team_id if isinstance(auth, ApiToken) else None


def _narrow_to_token(request: Any, teams: frozenset[int] | None) -> frozenset[int] | None:
    token_team = request_token_team_id(request)
    if token_team is None:
        return teams
    return frozenset({token_team}) if teams is None else teams & {token_team}


def request_team_scope(request: Any) -> frozenset[int] | None:
    """The teams this request may see: its user's, narrowed to its key's team for a team key."""
    return _narrow_to_token(request, user_team_scope(request.user))


def request_teams_with_role(request: Any, allowed: frozenset[Role]) -> frozenset[int] | None:
    """The teams in which this request may act with one of `allowed` (e.g. OPERATORS to
    change); None: every team."""
    return _narrow_to_token(request, user_teams_with_role(request.user, allowed))


def request_write_team_scope(request: Any, write_roles: frozenset[Role] = OPERATORS) -> frozenset[int] | None:
    return request_teams_with_role(request, write_roles)


def request_team_admin_of(request: Any) -> frozenset[int] | None:
    """The teams whose settings and members this request may manage: every team (None) for a
    platform admin, else those its user administers, narrowed to its key's team for a team key."""
    if Role.ADMIN in global_roles(request.user):
        return _narrow_to_token(request, None)
    return _narrow_to_token(request, user_team_admin_of(request.user))


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


def user_has_any_role(user: User | AnonymousUser) -> bool:
    """A global role or at least one membership: enough to sign in to the pages."""
    return bool(global_roles(user) & ALL_ROLES) or bool(user_team_roles(user))


def user_may_change_team_object(
    user: User | AnonymousUser, team_id: int | None, allowed: frozenset[Role] = OPERATORS
) -> bool:
    """May this user change an object of team `team_id` (None: a platform object)? A global role
    in `allowed` (or admin) changes any; a team-scoped user needs one of `allowed` in that very
    team, and never changes a platform object."""
    teams = user_teams_with_role(user, allowed)
    if teams is None:
        return True
    return team_id is not None and team_id in teams
