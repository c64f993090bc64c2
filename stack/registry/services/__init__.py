"""Writes to the registry. Views, API viewsets, tasks and commands call these.

One module per concern; every public name is re-exported here, so callers import from
`stack.registry.services` as before.
"""

from __future__ import annotations

from stack.registry.services.clusters import (
    INTERRUPTION_DEFAULT_SECONDS,
    INTERRUPTION_MAX_SECONDS,
    HealthTransition,
    cluster_health_check,
    cluster_heartbeat,
    cluster_interruption_notice,
    cluster_set_draining,
)
from stack.registry.services.errors import (
    RegistryError,
)
from stack.registry.services.failovers import (
    failover_event_record,
    failover_event_recover,
)
from stack.registry.services.limits import (
    RATE_LIMIT_MAX,
    rate_limit_check,
)
from stack.registry.services.memberships import (
    team_membership_remove,
    team_membership_set,
)
from stack.registry.services.providers import (
    provider_endpoints_allow,
    provider_set_credentials,
)
from stack.registry.services.sso_logins import (
    SSO_GROUP_PREFIX,
    SSO_MAX_GROUP_LENGTH,
    SSO_MAX_GROUPS,
    SSO_MAX_SUBJECT_LENGTH,
    SSO_ROLE_PRECEDENCE,
    MembershipSync,
    sso_user_login,
    sso_username_from_claims,
    team_memberships_sync_from_claims,
)
from stack.registry.services.tokens import (
    TOKEN_NAME_MAX_LENGTH,
    TOKEN_PREFIX,
    api_token_authenticate,
    api_token_create,
    api_token_limits_may_raise,
    api_token_limits_set,
    api_token_revoke,
    api_token_team_check,
)
from stack.registry.services.workflows import (
    workflow_create,
    workflow_policy_change,
    workflow_retention_check,
    workflow_retention_set,
    workflow_switch_primary,
)

__all__ = [
    "HealthTransition",
    "INTERRUPTION_DEFAULT_SECONDS",
    "INTERRUPTION_MAX_SECONDS",
    "MembershipSync",
    "RATE_LIMIT_MAX",
    "RegistryError",
    "SSO_GROUP_PREFIX",
    "SSO_MAX_GROUPS",
    "SSO_MAX_GROUP_LENGTH",
    "SSO_MAX_SUBJECT_LENGTH",
    "SSO_ROLE_PRECEDENCE",
    "TOKEN_NAME_MAX_LENGTH",
    "TOKEN_PREFIX",
    "api_token_authenticate",
    "api_token_limits_may_raise",
    "api_token_create",
    "api_token_limits_set",
    "api_token_revoke",
    "api_token_team_check",
    "cluster_health_check",
    "cluster_heartbeat",
    "cluster_interruption_notice",
    "cluster_set_draining",
    "failover_event_record",
    "failover_event_recover",
    "provider_endpoints_allow",
    "provider_set_credentials",
    "rate_limit_check",
    "sso_user_login",
    "sso_username_from_claims",
    "team_membership_remove",
    "team_membership_set",
    "team_memberships_sync_from_claims",
    "workflow_create",
    "workflow_policy_change",
    "workflow_retention_check",
    "workflow_retention_set",
    "workflow_switch_primary",
]
