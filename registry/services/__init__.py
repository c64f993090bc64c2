"""Writes to the registry. Views, API viewsets, tasks and commands call these.

One module per concern; every public name is re-exported here, so callers import from
`registry.services` as before.
"""

from __future__ import annotations

from registry.services.clusters import (
    CLUSTER_FIELDS,
    INTERRUPTION_DEFAULT_SECONDS,
    INTERRUPTION_MAX_SECONDS,
    HealthTransition,
    cluster_create,
    cluster_health_check,
    cluster_heartbeat,
    cluster_interruption_notice,
    cluster_set_draining,
    cluster_update,
)
from registry.services.deployments import (
    DEPLOYMENT_FIELDS,
    deployment_check,
    deployment_create,
    deployment_update,
)
from registry.services.errors import (
    RegistryError,
    RegistryFieldsError,
)
from registry.services.failovers import (
    failover_event_record,
    failover_event_recover,
)
from registry.services.limits import (
    RATE_LIMIT_MAX,
    rate_limit_check,
)
from registry.services.memberships import (
    team_membership_remove,
    team_membership_set,
)
from registry.services.providers import (
    PROVIDER_FIELDS,
    provider_base_url_check,
    provider_check,
    provider_create,
    provider_endpoints_allow,
    provider_endpoints_check,
    provider_set_credentials,
    provider_update,
)
from registry.services.registered_models import (
    REGISTERED_MODEL_FIELDS,
    registered_model_artifact_uri_check,
    registered_model_check,
    registered_model_create,
    registered_model_update,
)
from registry.services.sso_logins import (
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
from registry.services.tokens import (
    TOKEN_NAME_MAX_LENGTH,
    TOKEN_PREFIX,
    api_token_authenticate,
    api_token_create,
    api_token_limits_may_raise,
    api_token_limits_set,
    api_token_revoke,
    api_token_sso_deadline,
    api_token_team_check,
)
from registry.services.workflows import (
    MAX_CACHE_ENTRIES,
    MAX_CACHE_SECONDS,
    SEMANTIC_THRESHOLD_RANGE,
    WORKFLOW_FIELDS,
    workflow_cache_check,
    workflow_check,
    workflow_create,
    workflow_policy_change,
    workflow_retention_check,
    workflow_retention_set,
    workflow_semantic_check,
    workflow_switch_primary,
    workflow_update,
)

__all__ = [
    "WORKFLOW_FIELDS",
    "CLUSTER_FIELDS",
    "REGISTERED_MODEL_FIELDS",
    "DEPLOYMENT_FIELDS",
    "HealthTransition",
    "INTERRUPTION_DEFAULT_SECONDS",
    "INTERRUPTION_MAX_SECONDS",
    "MembershipSync",
    "RATE_LIMIT_MAX",
    "RegistryError",
    "RegistryFieldsError",
    "SSO_GROUP_PREFIX",
    "SSO_MAX_GROUPS",
    "SSO_MAX_GROUP_LENGTH",
    "SSO_MAX_SUBJECT_LENGTH",
    "SSO_ROLE_PRECEDENCE",
    "TOKEN_NAME_MAX_LENGTH",
    "TOKEN_PREFIX",
    "api_token_authenticate",
    "api_token_sso_deadline",
    "api_token_limits_may_raise",
    "api_token_create",
    "api_token_limits_set",
    "api_token_revoke",
    "api_token_team_check",
    "cluster_health_check",
    "cluster_heartbeat",
    "cluster_interruption_notice",
    "cluster_create",
    "cluster_set_draining",
    "cluster_update",
    "deployment_check",
    "deployment_create",
    "deployment_update",
    "failover_event_record",
    "failover_event_recover",
    "PROVIDER_FIELDS",
    "provider_base_url_check",
    "provider_check",
    "provider_create",
    "provider_endpoints_allow",
    "provider_endpoints_check",
    "provider_set_credentials",
    "provider_update",
    "rate_limit_check",
    "registered_model_artifact_uri_check",
    "registered_model_check",
    "registered_model_create",
    "registered_model_update",
    "sso_user_login",
    "sso_username_from_claims",
    "team_membership_remove",
    "team_membership_set",
    "team_memberships_sync_from_claims",
    "MAX_CACHE_ENTRIES",
    "MAX_CACHE_SECONDS",
    "SEMANTIC_THRESHOLD_RANGE",
    "workflow_cache_check",
    "workflow_check",
    "workflow_create",
    "workflow_policy_change",
    "workflow_retention_check",
    "workflow_retention_set",
    "workflow_semantic_check",
    "workflow_switch_primary",
    "workflow_update",
]
