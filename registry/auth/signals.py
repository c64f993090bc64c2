"""Move the authorisation version (registry.auth.version) whenever what a token may do
changes: tokens, their workflows, users, their groups (roles) and the groups themselves, team
memberships, and workflows (a workflow moved to another team leaves its old team's keys)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models.signals import m2m_changed, post_delete, post_save

from registry.auth.version import auth_version_bump
from registry.models import ApiToken, Team, TeamMembership, Workflow

_M2M_CHANGES = frozenset({"post_add", "post_remove", "post_clear"})


def _saved(*, created: bool = False, update_fields: frozenset[str] | None = None, **kwargs: Any) -> None:
    if created:
        return  # nothing cached can name a row that did not exist
    if update_fields is not None and set(update_fields) <= {"last_login", "last_used_at"}:
        return  # a login's or a token's use stamp: nothing a grant reads
    auth_version_bump()


def _always(**kwargs: Any) -> None:
    # A new membership widens what its user's existing tokens reach, unlike a new token.
    auth_version_bump()


def _deleted(**kwargs: Any) -> None:
    auth_version_bump()


def _m2m(*, action: str, **kwargs: Any) -> None:
    if action in _M2M_CHANGES:
        auth_version_bump()


def connect() -> None:
    """Called by RegistryConfig.ready."""
    user_model = get_user_model()
    # A team's rate limits are part of its keys' grants.
    for model in (ApiToken, user_model, Group, Team):
        uid = f"registry-auth-version-{model._meta.label_lower}"
        post_save.connect(_saved, sender=model, dispatch_uid=f"{uid}-save")
        post_delete.connect(_deleted, sender=model, dispatch_uid=f"{uid}-delete")
    for team_model in (TeamMembership, Workflow):
        uid = f"registry-auth-version-{team_model._meta.label_lower}"
        post_save.connect(_always, sender=team_model, dispatch_uid=f"{uid}-save")
        post_delete.connect(_always, sender=team_model, dispatch_uid=f"{uid}-delete")
    # The through models see both sides: user.groups.add(g) and g.user_set.add(u) alike.
    m2m_changed.connect(_m2m, sender=user_model.groups.through, dispatch_uid="registry-auth-version-groups")
    m2m_changed.connect(_m2m, sender=ApiToken.workflows.through, dispatch_uid="registry-auth-version-tokens")
