"""The teams rule (registry.auth.teams): who is platform-wide, which teams a team member sees,
what a team role grants, and how a team key narrows a request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from registry.auth.principal import principal_of_user
from registry.auth.roles import OPERATORS, Role
from registry.auth.teams import (
    request_team_scope,
    request_teams_with_role,
    user_is_platform_wide,
    user_team_scope,
)
from registry.models import TeamMembership
from registry.selectors import workflows_visible
from registry.services import api_token_create
from tests.factories import make_member, make_team, make_user, make_workflow

pytestmark = pytest.mark.django_db


def _fresh(user):  # the per-request caches live on the user object
    return type(user).objects.get(pk=user.pk)


def test_a_user_with_a_global_role_sees_every_team_and_a_member_only_its_own() -> None:
    red, blue = make_team("red"), make_team("blue")
    platform = make_user(Role.VIEWER)
    member = make_user()
    make_member(red, Role.OPERATOR, user=member)
    assert user_is_platform_wide(platform) and user_team_scope(platform) is None
    assert not user_is_platform_wide(member)
    assert user_team_scope(member) == {red.pk}
    owner = make_user(Role.ADMIN)
    mine, theirs = make_workflow(owner=owner, team=red), make_workflow(owner=owner, team=blue)
    assert set(workflows_visible(user=member)) == {mine}
    assert set(workflows_visible(user=platform)) == {mine, theirs}
    assert user_team_scope(make_user()) == frozenset()  # no role anywhere: nothing


def test_a_team_admin_is_operator_and_auditor_of_its_team_never_a_platform_admin() -> None:
    red, blue = make_team("red"), make_team("blue")
    user = make_user()
    make_member(red, Role.ADMIN, user=user)
    make_member(blue, Role.VIEWER, user=user)
    user = _fresh(user)
    principal = principal_of_user(user)
    assert principal.roles_in(red.pk) == {Role.OPERATOR, Role.AUDITOR}  # a team admin, no more
    assert principal.roles_in(blue.pk) == {Role.VIEWER}  # never the union of its teams' roles
    assert principal.roles_in(None) == frozenset()
    request = SimpleNamespace(user=user, auth=None)
    assert request_teams_with_role(request, OPERATORS) == {red.pk}  # may change red's rows only
    assert request_team_scope(request) == {red.pk, blue.pk}


def test_a_team_key_narrows_its_request_to_its_team_even_for_a_platform_user() -> None:
    red, blue = make_team("red"), make_team("blue")
    platform = make_user(Role.OPERATOR)
    token, _ = api_token_create(user=platform, name="red-key", team=red)
    assert request_team_scope(SimpleNamespace(user=platform, auth=token)) == {red.pk}
    member = make_user()
    make_member(red, Role.OPERATOR, user=member)
    make_member(blue, Role.OPERATOR, user=member)
    member_key, _ = api_token_create(user=member, name="red-key", team=red)
    TeamMembership.objects.filter(user=member, team=red).delete()  # the member left red since
    # The key's team and the user's teams no longer meet: the request reaches nothing.
    assert request_team_scope(SimpleNamespace(user=_fresh(member), auth=member_key)) == frozenset()
