"""Writes on teams and their members: the only code that creates, changes or deletes a Team or a
TeamMembership (the API and pages call these; django-auditlog records each change, and the
registry's signals move the authorisation version when a membership changes).

Who may call them is the caller's business (registry.auth.teams.request_team_admin_of): a
platform admin creates and deletes teams, a platform admin or the team's admin changes its name,
limits and members (a team admin only under the limits a platform admin set: team_update). These functions check the values.
"""

from __future__ import annotations

import re

from django.contrib.auth.models import User
from django.db import transaction

from registry.auth.roles import Role
from registry.errors import DomainError, MultiFieldError
from registry.models import Team, TeamMembership
from registry.validation import text_problem

# The slug names the team in ledger rows, rollups and budgets, in URLs and in SSO group
# mappings: lower-case letters, digits and single inner hyphens, never changed once made.
TEAM_SLUG_PATTERN = r"[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?"
_TEAM_SLUG = re.compile(TEAM_SLUG_PATTERN)
TEAM_SLUG_RULE = "lower-case letters, digits and hyphens (not first or last), at most 64 characters"
TEAM_NAME_MAX = 100  # Team.name
TEAM_RATE_LIMIT_MAX = 2_147_483_647  # the PositiveIntegerField columns of rpm_limit and tpm_limit
MEMBERSHIP_SOURCES = frozenset({"manual", "sso"})


class TeamError(DomainError, ValueError):
    """A change to a team or its members that is not allowed; the message is for the user."""


class TeamInvalid(MultiFieldError, ValueError):
    """Team values that do not describe a team (`errors`: field -> messages)."""


def team_slug_problem(slug: str) -> str | None:
    """Why `slug` cannot name a team, or None."""
    if not _TEAM_SLUG.fullmatch(slug) or "--" in slug:
        return f"a team's slug is {TEAM_SLUG_RULE}"
    return None


def _values_errors(*, name: str, rpm_limit: int | None, tpm_limit: int | None) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    if not name.strip():
        errors["name"] = ["a team needs a name"]
    elif len(name) > TEAM_NAME_MAX:
        errors["name"] = [f"at most {TEAM_NAME_MAX} characters"]
    elif problem := text_problem(name):
        errors["name"] = [problem]
    for field, value in (("rpm_limit", rpm_limit), ("tpm_limit", tpm_limit)):
        if value is not None and not 0 <= value <= TEAM_RATE_LIMIT_MAX:
            errors[field] = [f"a rate limit is a whole number from 0 to {TEAM_RATE_LIMIT_MAX}"]
    return errors


def team_create(*, slug: str, name: str, rpm_limit: int | None = None, tpm_limit: int | None = None) -> Team:
    """A new team with no members yet. Raises TeamInvalid naming each bad field."""
    errors = _values_errors(name=name, rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    if problem := team_slug_problem(slug):
        errors["slug"] = [problem]
    elif Team.objects.filter(slug=slug).exists():
        errors["slug"] = [f"a team {slug} exists already"]
    if errors:
        raise TeamInvalid(errors)
    # Teams are made by platform admins: the limits they start with are the platform's caps.
    return Team.objects.create(
        slug=slug,
        name=name.strip(),
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        rpm_cap=rpm_limit,
        tpm_cap=tpm_limit,
    )


def team_update(
    *, team: Team, name: str, rpm_limit: int | None, tpm_limit: int | None, by_platform: bool
) -> Team:
    """Change a team's name and limits (its slug never changes: the ledger names it).

    Limits a platform admin sets (`by_platform`) become the team's caps; the team's own admins
    may set a limit at or under its cap, never above it or cleared (no limit), while a cap is set."""
    errors = _values_errors(name=name, rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    if not by_platform:
        for field, cap, wanted in (
            ("rpm_limit", team.rpm_cap, rpm_limit),
            ("tpm_limit", team.tpm_cap, tpm_limit),
        ):
            if cap is not None and (wanted is None or wanted > cap) and field not in errors:
                errors[field] = [
                    f"a platform admin capped this at {cap}: you may lower it, not raise or clear it"
                ]
    if errors:
        raise TeamInvalid(errors)
    team.name, team.rpm_limit, team.tpm_limit = name.strip(), rpm_limit, tpm_limit
    fields = ["name", "rpm_limit", "tpm_limit"]
    if by_platform:
        team.rpm_cap, team.tpm_cap = rpm_limit, tpm_limit
        fields += ["rpm_cap", "tpm_cap"]
    team.save(update_fields=fields)
    return team


def team_delete(*, team: Team) -> None:
    """Delete a team and its memberships. A team that still owns workflows, API keys, training
    runs or /v1 files is kept: they would become platform objects, which its members no longer see."""
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        owned = [
            (count, what)
            for count, what in (
                (team.workflows.count(), "workflows"),
                (team.api_tokens.count(), "API keys"),
                (team.training_runs.count(), "training runs"),  # type: ignore[attr-defined]
                (team.gateway_files.count(), "/v1 files"),  # type: ignore[attr-defined]
            )
            if count
        ]
        if owned:
            listed = ", ".join(f"{count} {what}" for count, what in owned)
            raise TeamError(f"team {team.slug} still owns {listed}: move or delete them first")
        team.delete()


def team_membership_set(*, team: Team, user: User, role: str, source: str = "manual") -> TeamMembership:
    """Give `user` the `role` in `team` (a new membership, or a new role for an existing one)."""
    if role not in Role.values:
        raise TeamError(f"a team role is one of {', '.join(Role.values)}", field="role")
    if source not in MEMBERSHIP_SOURCES:
        raise TeamError(
            f"a membership's source is one of {', '.join(sorted(MEMBERSHIP_SOURCES))}", field="source"
        )
    if not user.is_active:
        raise TeamError(f"user {user.get_username()} is deactivated", field="user")
    with transaction.atomic():
        membership = TeamMembership.objects.select_for_update().filter(team=team, user=user).first()
        if membership is None:
            return TeamMembership.objects.create(team=team, user=user, role=role, source=source)
        if (membership.role, membership.source) != (role, source):
            membership.role, membership.source = role, source
            membership.save(update_fields=["role", "source"])
        return membership


def team_membership_remove(*, team: Team, user: User) -> bool:
    """Take `user` out of `team`; False when it was not a member."""
    membership = TeamMembership.objects.filter(team=team, user=user).first()
    if membership is None:
        return False
    membership.delete()  # one by one, so the audit trail and the auth version see it
    return True
