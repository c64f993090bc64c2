"""Which models the trail follows, and how their secrets are kept out of it.

Secrets (provider credentials, API token hashes, budget webhook secrets, password hashes) are
masked by django-auditlog's `mask_fields` with `secret_marker`: the diff compares the real
values, so a change is recorded, but only "[secret]" or "" is stored. Fields that change on
every use (last_used_at, last_login, heartbeats) are left out: they are not changes of setting.
"""

from __future__ import annotations

from typing import Any

from auditlog.registry import auditlog
from django.apps import apps

MASKED = "[secret]"

# app_label.Model -> django-auditlog register() options.
TRACKED: dict[str, dict[str, Any]] = {
    "stack.Team": {},
    "stack.TeamMembership": {},
    "stack.Provider": {"mask_fields": ["credentials_encrypted"]},
    "stack.Cluster": {"exclude_fields": ["last_heartbeat_at"]},
    "stack.RegisteredModel": {},
    "stack.Deployment": {},
    "stack.Workflow": {},
    "stack.RoutingPolicyVersion": {},
    "stack.RoutingPolicyEntry": {},
    "stack.ApiToken": {
        "mask_fields": ["key_hash"],
        "exclude_fields": ["last_used_at"],
        "m2m_fields": {"workflows"},
    },
    "billing.PriceBook": {},
    "billing.Budget": {"mask_fields": ["webhook_secret_encrypted"]},
    "inference.ChaosConfig": {},
    "decisions.Recommendation": {},
    "auth.User": {"mask_fields": ["password"], "exclude_fields": ["last_login"], "m2m_fields": {"groups"}},
    "auth.Group": {},
}


def secret_marker(value: str) -> str:
    """Stands in for a secret in the trail: whether one is set, never any part of it."""
    # The diff turns a missing value into "None" (a new object) before masking.
    return "" if value in ("", "None") else MASKED


def register_tracked_models() -> None:
    for label, options in TRACKED.items():
        model = apps.get_model(label)
        if options.get("mask_fields"):
            options = {**options, "mask_callable": "registry.audit.registration.secret_marker"}
        auditlog.register(model, **options)


def object_types() -> list[tuple[str, str]]:
    """(value, label) of each tracked model, for the filters: "stack.provider"."""
    out = []
    for label in TRACKED:
        meta = apps.get_model(label)._meta
        out.append((meta.label_lower, str(meta.verbose_name)))
    return sorted(out)
