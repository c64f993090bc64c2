"""Single sign-on's rules without a provider: the groups claim becomes "sso" team memberships
(team_memberships_sync_from_claims), audited and moving the authorisation version, and a login
finds its user by issuer and subject, never by a name a provider chose (sso_user_login)."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth.models import User

from registry.audit.models import AuditEntry
from registry.audit.origin import Surface, audit_origin
from registry.auth.roles import Role
from registry.auth.version import auth_version
from registry.models import SsoIdentity, Team, TeamMembership
from registry.services import (
    RegistryError,
    sso_user_login,
    sso_username_from_claims,
    team_memberships_sync_from_claims,
)
from tests.factories import make_member, make_team, make_user

pytestmark = pytest.mark.django_db

ISSUER = "https://idp.example.com"


def memberships(user: User) -> dict[str, tuple[str, str]]:
    return {m.team.slug: (m.role, m.source) for m in TeamMembership.objects.filter(user=user)}


@pytest.fixture
def teams() -> dict[str, Team]:
    return {slug: make_team(slug) for slug in ("red", "blue", "green")}


def test_a_group_naming_a_team_and_role_makes_an_sso_membership(teams: dict[str, Team]) -> None:
    user = make_user()
    sync = team_memberships_sync_from_claims(
        user=user, groups=["switchyard:red:operator", "switchyard:blue:viewer", "Domain Users"]
    )
    assert memberships(user) == {"red": ("operator", "sso"), "blue": ("viewer", "sso")}
    assert sync.added == (("blue", "viewer"), ("red", "operator"))


def test_unknown_teams_and_roles_are_ignored_and_logged_never_created(
    teams: dict[str, Team], caplog: pytest.LogCaptureFixture
) -> None:
    user = make_user()
    with caplog.at_level(logging.WARNING, logger="registry.services"):
        sync = team_memberships_sync_from_claims(
            user=user,
            groups=[
                "switchyard:nope:operator",
                "switchyard:red:owner",
                "switchyard:red",
                "switchyard:a b:viewer",
            ],
        )
    assert memberships(user) == {}
    assert not Team.objects.filter(slug="nope").exists()
    assert set(sync.ignored) == {
        "switchyard:nope:operator",
        "switchyard:red:owner",
        "switchyard:red",
        "switchyard:a b:viewer",
    }
    assert "switchyard:nope:operator" in caplog.text
    assert "switchyard:red:owner" in caplog.text


def test_two_roles_in_one_team_give_the_strongest(teams: dict[str, Team]) -> None:
    user = make_user()
    team_memberships_sync_from_claims(user=user, groups=["switchyard:red:viewer", "switchyard:red:admin"])
    assert memberships(user) == {"red": ("admin", "sso")}


def test_a_group_dropped_from_the_claim_removes_its_sso_membership_and_keeps_manual_ones(
    teams: dict[str, Team],
) -> None:
    user = make_user()
    make_member(teams["green"], Role.AUDITOR, user=user)
    team_memberships_sync_from_claims(user=user, groups=["switchyard:red:operator", "switchyard:blue:viewer"])
    sync = team_memberships_sync_from_claims(user=user, groups=["switchyard:red:viewer"])
    assert memberships(user) == {"red": ("viewer", "sso"), "green": ("auditor", "manual")}
    assert sync.removed == ("blue",)
    assert sync.changed == (("red", "viewer"),)


def test_a_manual_membership_is_not_changed_by_the_claim(teams: dict[str, Team]) -> None:
    user = make_user()
    make_member(teams["red"], Role.VIEWER, user=user)
    team_memberships_sync_from_claims(user=user, groups=["switchyard:red:admin"])
    assert memberships(user) == {"red": ("viewer", "manual")}


@pytest.mark.parametrize("claim", [None, "not-a-list-of-groups", 42, {"red": "admin"}])
def test_a_missing_or_malformed_claim_removes_every_sso_membership(
    teams: dict[str, Team], claim: object
) -> None:
    user = make_user()
    team_memberships_sync_from_claims(user=user, groups=["switchyard:red:operator"])
    team_memberships_sync_from_claims(user=user, groups=claim)
    assert memberships(user) == {}


def test_a_claim_longer_than_the_bound_grants_nothing(teams: dict[str, Team]) -> None:
    user = make_user()
    team_memberships_sync_from_claims(user=user, groups=["switchyard:red:operator"] + ["x"] * 1000)
    assert memberships(user) == {}


def test_every_membership_change_is_audited_and_moves_the_authorisation_version(
    teams: dict[str, Team],
) -> None:
    user = make_user()
    before = auth_version().read()
    with audit_origin(surface=Surface.WEB, label="sso:u1"):
        team_memberships_sync_from_claims(
            user=user, groups=["switchyard:red:operator", "switchyard:blue:viewer"]
        )
        team_memberships_sync_from_claims(user=user, groups=["switchyard:red:admin"])
    assert auth_version().read() != before
    rows = AuditEntry.objects.filter(content_type__model="teammembership")
    actions = sorted((row.action, row.actor_label, row.surface) for row in rows)
    assert actions == [
        (AuditEntry.Action.CREATE, "sso:u1", "web"),
        (AuditEntry.Action.CREATE, "sso:u1", "web"),
        (AuditEntry.Action.UPDATE, "sso:u1", "web"),
        (AuditEntry.Action.DELETE, "sso:u1", "web"),
    ]
    assert rows.get(action=AuditEntry.Action.UPDATE).changes["role"] == ["operator", "admin"]


def test_a_first_login_creates_the_user_without_a_password_and_links_the_identity(
    teams: dict[str, Team],
) -> None:
    claims = {
        "sub": "u-1",
        "preferred_username": "alice",
        "email": "alice@example.com",
        "groups": ["switchyard:red:viewer"],
    }
    user, sync = sso_user_login(issuer=ISSUER, claims=claims, groups_claim="groups")
    assert (user.username, user.email, user.has_usable_password()) == ("alice", "alice@example.com", False)
    assert not user.is_staff and not user.is_superuser
    assert SsoIdentity.objects.get(user=user).subject == "u-1"
    assert sync.added == (("red", "viewer"),)


def test_a_later_login_finds_the_user_by_subject_even_when_its_name_changed(teams: dict[str, Team]) -> None:
    first, _ = sso_user_login(
        issuer=ISSUER, claims={"sub": "u-1", "preferred_username": "alice"}, groups_claim="groups"
    )
    again, _ = sso_user_login(
        issuer=ISSUER,
        claims={"sub": "u-1", "preferred_username": "alice2", "email": "new@example.com"},
        groups_claim="groups",
    )
    assert again.pk == first.pk
    assert again.username == "alice"
    assert User.objects.get(pk=first.pk).email == "new@example.com"


def test_a_provider_user_named_like_a_local_account_does_not_take_it_over() -> None:
    admin = make_user(Role.ADMIN, username="root")
    with pytest.raises(RegistryError, match="not linked"):
        sso_user_login(
            issuer=ISSUER, claims={"sub": "evil", "preferred_username": "ROOT"}, groups_claim="groups"
        )
    assert not SsoIdentity.objects.exists()
    assert User.objects.filter(username__iexact="root").get() == admin


def test_the_same_subject_at_another_issuer_is_another_user() -> None:
    sso_user_login(issuer=ISSUER, claims={"sub": "u-1", "preferred_username": "alice"}, groups_claim="groups")
    with pytest.raises(RegistryError):
        sso_user_login(
            issuer="https://other.example.com",
            claims={"sub": "u-1", "preferred_username": "alice"},
            groups_claim="groups",
        )


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"sub": "s-1", "preferred_username": "bob"}, "bob"),
        ({"sub": "s-1"}, "s-1"),
        ({"sub": "s-1", "preferred_username": ""}, "s-1"),
    ],
)
def test_the_username_is_preferred_username_else_the_subject(claims: dict[str, str], expected: str) -> None:
    assert sso_username_from_claims(claims=claims) == expected


@pytest.mark.parametrize(
    "claims",
    [
        {"sub": "s-1", "preferred_username": "bob smith"},
        {"sub": "s-1", "preferred_username": "bob/../admin"},
        {"sub": "s-1", "preferred_username": "b\x00b"},
        {"sub": "s-1", "preferred_username": "x" * 151},
        {"sub": "s-1", "preferred_username": ["bob"]},
        {"sub": "https://idp.example.com/users/1"},
    ],
)
def test_a_username_django_would_not_accept_is_refused(claims: dict[str, object]) -> None:
    with pytest.raises(RegistryError):
        sso_username_from_claims(claims=claims)


def test_a_login_without_a_subject_is_refused() -> None:
    with pytest.raises(RegistryError, match="subject"):
        sso_user_login(issuer=ISSUER, claims={"preferred_username": "alice"}, groups_claim="groups")
    assert not User.objects.filter(username="alice").exists()
