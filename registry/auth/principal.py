"""The principal: who is calling, resolved once per request, and the one question every surface
asks of it — "what may this caller do to an object of team T?".

A principal is a user (signed in to the pages, or behind an API key) with:

- its global roles (Django groups; a superuser is an admin), which hold on every team;
- its role in each team it is a member of (TeamMembership), which holds in that team only: a
  viewer of alpha who operates beta is a viewer in alpha, never an operator there;
- for a key: the key's team and the workflows the key is limited to.

The rule, in `Principal.roles_in`:

- a session acts in team T with its global roles plus its role in T;
- a team key acts in its own team only, with the same roles as its user there; every other team
  (and the platform's own objects) is out of its reach;
- a key with no team acts with its user's global roles only (a team member's legacy key with no
  team reaches nothing a global role does not grant).

Nothing is a union across teams: `can_see_costs`, lists, pages, exports, /v1 and jobs all ask
`roles_in(team)` (or `teams_with(roles)`, the teams where that answer allows something). A
change to memberships, groups, keys or users moves the authorisation version
(registry.auth.version), so a cached principal is used only while nothing changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from django.contrib.auth.models import AnonymousUser, User

from registry.auth.roles import ALL_ROLES, COST_READERS, Role, global_roles
from registry.models import ApiToken, TeamMembership

_PRINCIPAL_ATTR = "_switchyard_principal"
_USER_PRINCIPAL_ATTR = "_switchyard_user_principal"
_SCOPE_ATTR = "_switchyard_workflow_scope"

# What a role in a team amounts to inside that team. A team admin is an operator and an auditor
# of it (it reads the team's ledger and changes its objects) and manages its members and keys;
# it never becomes a platform admin.
TEAM_ROLE_GRANTS: dict[str, frozenset[Role]] = {
    Role.VIEWER: frozenset({Role.VIEWER}),
    Role.OPERATOR: frozenset({Role.OPERATOR}),
    Role.AUDITOR: frozenset({Role.AUDITOR}),
    Role.ADMIN: frozenset({Role.OPERATOR, Role.AUDITOR}),
}

_NONE: frozenset[Role] = frozenset()


def _grants(roles: frozenset[Role], allowed: frozenset[Role]) -> bool:
    return Role.ADMIN in roles or bool(roles & allowed)


@dataclass(frozen=True)
class Principal:
    """Who a request acts as. Build it with `principal_of` (a request) or `principal_of_user`."""

    user_id: int | None
    active: bool
    global_roles: frozenset[Role]
    # team id -> the roles held in that team (a team admin as operator + auditor).
    team_roles: Mapping[int, frozenset[Role]] = field(default_factory=dict)
    # The teams whose members, keys and settings this user manages (the team's admins).
    team_admin_of: frozenset[int] = frozenset()
    via_key: bool = False
    key_team_id: int | None = None
    # The workflows a key is limited to; None: not limited.
    workflow_ids: frozenset[int] | None = None

    # --- the one rule ---------------------------------------------------------------------------

    def roles_in(self, team_id: int | None) -> frozenset[Role]:
        """The roles this caller holds over an object of team `team_id` (None: a platform object,
        such as a cluster, a provider, or a workflow of no team)."""
        if not self.active:
            return _NONE
        if self.via_key:
            if self.key_team_id is None:
                return self.global_roles
            if team_id != self.key_team_id:
                return _NONE
        if team_id is None:
            return self.global_roles
        return self.global_roles | self.team_roles.get(team_id, _NONE)

    def may(self, allowed: frozenset[Role], team_id: int | None) -> bool:
        """Does the caller hold one of `allowed` (or admin) over an object of team `team_id`?"""
        return _grants(self.roles_in(team_id), allowed)

    def teams_with(self, allowed: frozenset[Role]) -> frozenset[int] | None:
        """The teams over whose objects this caller holds one of `allowed`; None: every team."""
        if not self.active:
            return frozenset()
        if self.via_key and self.key_team_id is not None:
            team = self.key_team_id
            return frozenset({team}) if self.may(allowed, team) else frozenset()
        if _grants(self.global_roles, allowed):
            return None
        if self.via_key:  # a key with no team: global roles only
            return frozenset()
        return frozenset(team for team, roles in self.team_roles.items() if _grants(roles, allowed))

    # --- derived questions ----------------------------------------------------------------------

    @property
    def visible_teams(self) -> frozenset[int] | None:
        """The teams whose objects this caller may read at all; None: every team."""
        return self.teams_with(ALL_ROLES)

    @property
    def has_any_role(self) -> bool:
        """Does the caller hold a role anywhere (enough to read shared objects and sign in)?"""
        return self.visible_teams != frozenset()

    def has_role_somewhere(self, allowed: frozenset[Role]) -> bool:
        return self.teams_with(allowed) != frozenset()

    @property
    def platform_wide(self) -> bool:
        """Does this caller see every team (a global role, not narrowed to a team key)?"""
        return self.visible_teams is None

    def sees_costs(self, team_id: int | None) -> bool:
        """May the caller see money figures of an object of team `team_id`? Ledger readers of
        that team (auditors, operators, admins) may; its viewers may not."""
        return self.may(COST_READERS, team_id)

    @property
    def cost_teams(self) -> frozenset[int] | None:
        """The teams whose money this caller may see; None: every team."""
        return self.teams_with(COST_READERS)

    @property
    def sees_any_costs(self) -> bool:
        """Does the caller see money somewhere (shared prices, the money menu)?"""
        return self.cost_teams != frozenset()

    def sees_costs_of_every_visible_team(self) -> bool:
        """Does the caller see the money of every team it may read (so an answer that mixes
        teams may carry money)?"""
        visible, costs = self.visible_teams, self.cost_teams
        if costs is None:
            return True
        return visible is not None and visible <= costs

    def manages_team(self, team_id: int) -> bool:
        """May the caller manage team `team_id`'s members, keys and settings?"""
        teams = self.managed_teams
        return teams is None or team_id in teams

    @property
    def managed_teams(self) -> frozenset[int] | None:
        """The teams whose members, keys and settings this caller manages; None: every team
        (a platform admin)."""
        if not self.active:
            return frozenset()
        if self.via_key and self.key_team_id is not None:
            team = self.key_team_id
            managed = Role.ADMIN in self.global_roles or team in self.team_admin_of
            return frozenset({team}) if managed else frozenset()
        if Role.ADMIN in self.global_roles:
            return None
        if self.via_key:
            return frozenset()
        return self.team_admin_of

    def allows_workflow(self, workflow_id: int, team_id: int | None) -> bool:
        """May the caller call (and read) workflow `workflow_id` of team `team_id`?"""
        if self.workflow_ids is not None and workflow_id not in self.workflow_ids:
            return False
        return self.may(ALL_ROLES, team_id)


ANONYMOUS = Principal(user_id=None, active=False, global_roles=frozenset())


def _memberships(user: User) -> tuple[dict[int, frozenset[Role]], frozenset[int]]:
    roles: dict[int, frozenset[Role]] = {}
    admin_of: set[int] = set()
    if user.pk is None:  # a user without a row (a test's admin object) is a member of nothing
        return roles, frozenset()
    for team_id, role in TeamMembership.objects.filter(user_id=user.pk).values_list("team_id", "role"):
        roles[team_id] = roles.get(team_id, frozenset()) | TEAM_ROLE_GRANTS.get(role, frozenset())
        if role == Role.ADMIN:
            admin_of.add(team_id)
    return roles, frozenset(admin_of)


def principal_of_user(user: User | AnonymousUser) -> Principal:
    """A signed-in user's principal (pages, sessions on the API, jobs acting for a user). Cached
    on the user object, which lives for one request."""
    if not user.is_authenticated:
        return ANONYMOUS
    cached: Principal | None = getattr(user, _USER_PRINCIPAL_ATTR, None)
    if cached is None:
        team_roles, admin_of = _memberships(user)  # type: ignore[arg-type]
        cached = Principal(
            user_id=user.pk,
            active=user.is_active,
            global_roles=global_roles(user),
            team_roles=team_roles,
            team_admin_of=admin_of,
        )
        setattr(user, _USER_PRINCIPAL_ATTR, cached)
    return cached


def token_workflow_scope(token: ApiToken) -> frozenset[int] | None:
    """The ids of the workflows a token is limited to; None when it is not limited (a token with
    no workflows listed reaches every workflow its user's roles reach). Cached on the token
    object, which lives for one request."""
    if hasattr(token, _SCOPE_ATTR):
        cached: frozenset[int] | None = getattr(token, _SCOPE_ATTR)
        return cached
    scope = frozenset(token.workflows.values_list("id", flat=True)) or None
    setattr(token, _SCOPE_ATTR, scope)
    return scope


def principal_of_key(
    token: ApiToken, workflow_ids: frozenset[int] | None, *, user: User | AnonymousUser | None = None
) -> Principal:
    """A key's principal: its user's roles (`user`: the request's copy of the key's user, if
    the caller has one), narrowed to the key's team (or to global roles for a key with no team)
    and to the workflows it is limited to."""
    owner = user if user is not None and user.pk == token.user_id else token.user
    return replace(
        principal_of_user(owner), via_key=True, key_team_id=token.team_id, workflow_ids=workflow_ids
    )


def request_key(request: Any) -> ApiToken | None:
    """The API key a request authenticated with (DRF sets `request.auth`); None for a session."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiToken) else None


def principal_keep(request: Any, principal: Principal) -> None:
    """Keep the principal of a request resolved elsewhere (the API's bearer authentication has
    its key's, from registry.auth.access's cache): principal_of answers it from then on."""
    with suppress(AttributeError):
        setattr(request, _PRINCIPAL_ATTR, principal)


def principal_of(request: Any) -> Principal:
    """The principal of a request (a page's HttpRequest or an API's DRF Request), resolved once
    and kept on the request."""
    cached: Principal | None = getattr(request, _PRINCIPAL_ATTR, None)
    if cached is not None:
        return cached
    key = request_key(request)
    user = getattr(request, "user", None)
    if key is not None:
        principal = principal_of_key(key, token_workflow_scope(key), user=user)
    elif user is not None:
        principal = principal_of_user(user)
    else:
        principal = ANONYMOUS
    with suppress(AttributeError):  # a request object that takes no attributes: resolve again next time
        setattr(request, _PRINCIPAL_ATTR, principal)
    return principal


# --- The same questions for a signed-in user (pages, sessions) -----------------------------------


def user_has_role(user: User | AnonymousUser, allowed: frozenset[Role]) -> bool:
    """Does the user hold one of `allowed` in some team (or globally)? Enough to open a page
    whose rows are then filtered to the teams where it holds it."""
    return principal_of_user(user).has_role_somewhere(allowed)


def can_see_costs(who: Any, team_id: int | None) -> bool:
    """May `who` (a user or a request) see the money of an object of team `team_id`?"""
    principal = principal_of_user(who) if isinstance(who, User | AnonymousUser) else principal_of(who)
    return principal.sees_costs(team_id)


def sees_any_costs(who: Any) -> bool:
    """Does `who` (a user or a request) see money in some team (the money menus, shared prices)?"""
    principal = principal_of_user(who) if isinstance(who, User | AnonymousUser) else principal_of(who)
    return principal.sees_any_costs
