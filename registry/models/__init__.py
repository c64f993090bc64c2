"""The registry's models, one module per family: providers, clusters, registered models and
deployments (providers), teams and members (teams), workflows and their routing-policy versions
(workflows), API keys (tokens) and the one failover log of the stack (failovers). Every model is
importable from registry.models."""

from __future__ import annotations

from registry.models.failovers import FailoverEvent
from registry.models.providers import Cluster, Deployment, Provider, RegisteredModel, WorkerHeartbeat
from registry.models.teams import SsoIdentity, Team, TeamMembership
from registry.models.tokens import ApiToken
from registry.models.workflows import (
    MAX_PROMPT_RETENTION_DAYS,
    ImmutableRowError,
    RoutingPolicyEntry,
    RoutingPolicyVersion,
    Workflow,
)

__all__ = [
    "ApiToken",
    "Cluster",
    "Deployment",
    "FailoverEvent",
    "ImmutableRowError",
    "MAX_PROMPT_RETENTION_DAYS",
    "Provider",
    "RegisteredModel",
    "RoutingPolicyEntry",
    "RoutingPolicyVersion",
    "SsoIdentity",
    "Team",
    "TeamMembership",
    "WorkerHeartbeat",
    "Workflow",
]
