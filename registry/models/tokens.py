"""API keys: hashed, scoped to workflows and a team, with their own limits."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone

from registry.models.teams import Team
from registry.models.workflows import Workflow


class ApiToken(models.Model):
    """A bearer token for the API; only its SHA-256 is stored. `user` is who created it (the
    roles it acts with); `team` is who it spends for (ledger rows and budgets name both)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    # A team key reaches only its team's workflows and is what the ledger charges per key; None:
    # a platform key of a platform-wide user.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A token listing workflows reaches only them, on /v1 and on every /api/ endpoint
    # (registry.auth.access, registry.auth.scoping); empty means every workflow its user may read.
    workflows = models.ManyToManyField(Workflow, blank=True, related_name="api_tokens")
    # Rate limits of this key on /v1 (inference.ratelimit.limits); empty means none. Redis unreachable:
    # the key's calls are let through unless it fails closed (then 503).
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens per minute")
    rate_limit_fail_closed = models.BooleanField(default=False)
    # After this instant (aware UTC) the key answers 401 on /api and /v1; empty: it never expires.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def expired(self, at: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= at

    def state_at(self, at: datetime) -> str:
        """What lists show: "revoked", "expired" (it answers 401 as a revoked one) or "active"."""
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expired(at) else "active"
