"""Teams, their members (a role per team) and the single-sign-on identities of users."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from registry.auth.roles import Role


class Team(models.Model):
    """A product team sharing the control panel: it owns workflows, budgets, API keys and
    training runs; clusters, providers and prices stay shared (registry.auth.teams says who
    sees what). The slug is what ledger rows and budgets name, so it never changes."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Limits for every key of this team together, on /v1 (inference.ratelimit.limits); empty means none.
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute, all keys")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens per minute, all keys")
    # The limits as a platform admin last set them: the team's admins may lower rpm_limit and
    # tpm_limit under these, never raise or clear them past (registry.services.teams).
    rpm_cap = models.PositiveIntegerField(null=True, blank=True, editable=False)
    tpm_cap = models.PositiveIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class TeamMembership(models.Model):
    """A user's role in one team (viewer, operator, auditor or admin of that team). Global roles
    (Django groups, registry.auth.roles) hold on every team; a user with only memberships sees
    only their teams."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    # "sso" rows are rewritten from the identity provider's group claim at each login; "manual"
    # rows are kept as an admin set them.
    source = models.CharField(max_length=8, default="manual", choices=[("manual", "Manual"), ("sso", "SSO")])
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["team__slug", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team_and_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class SsoIdentity(models.Model):
    """Which identity at which OpenID provider a user is: (issuer, subject) as the ID token
    names them. Logins find their user through this row, never by username or email, so an
    account at the provider cannot take over a local account that happens to share a name."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # The last login (interactive or silent re-authentication) that resynced this user from
    # the provider: the user's API keys stop working SWITCHYARD_SSO_KEY_SECONDS after it.
    synced_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_sso_identity")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
