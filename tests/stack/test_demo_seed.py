"""The demo's seed: two teams with a team-scoped operator each, safe to run twice."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from stack.demo_seed import demo_stack_seed
from stack.registry.models import Team, TeamMembership
from stack.registry.roles import Role
from stack.registry.teams import user_team_scope

pytestmark = pytest.mark.django_db


def test_the_demo_seeds_two_teams_each_with_an_operator_who_sees_only_it() -> None:
    for _ in range(2):  # idempotent
        stack = demo_stack_seed(admin_password="admin-pw-1", now=timezone.now(), team_password="team-pw-1")
    assert stack.team_users == ["support-op", "platform-op"]
    assert set(Team.objects.values_list("slug", flat=True)) >= {"support", "platform"}
    for username, slug in (("support-op", "support"), ("platform-op", "platform")):
        user = User.objects.get(username=username)
        assert user.check_password("team-pw-1") and not user.is_superuser
        assert list(TeamMembership.objects.filter(user=user).values_list("team__slug", "role")) == [
            (slug, Role.OPERATOR)
        ]
        assert user_team_scope(user) == frozenset({Team.objects.get(slug=slug).pk})
    assert user_team_scope(stack.admin) is None
