"""Deployments: created and changed here only (the API, the page form and the Django admin call
these), so a deployment's rules are checked in one place."""

from __future__ import annotations

from typing import Any

from registry.models import Deployment, Provider
from registry.outbound.endpoints import deployment_endpoint_problem
from registry.services.errors import RegistryError
from registry.services.records import fields_assign

# What a caller sets, in the order the page forms show them (registry.forms reads this).
DEPLOYMENT_FIELDS = (
    "slug",
    "model",
    "provider",
    "provider_model_id",
    "base_url",
    "hosting_cluster",
    "enabled",
    "supports_tools",
    "supports_json_schema",
    "supports_vision",
    "supports_embeddings",
    "speaks_responses",
    "max_context_tokens",
)


def deployment_check(deployment: Deployment) -> None:
    """A deployment's rules, on the state it would be saved with: it names the provider's model
    or a local endpoint, its endpoint lies under the provider's endpoints, which decide where
    the provider's credentials may be sent (registry.outbound.endpoints), and only an
    OpenAI-compatible one says it serves OpenAI's /responses."""
    if not deployment.provider_model_id and not deployment.base_url:
        raise RegistryError(
            "give the provider's model id or a local endpoint base_url", field="provider_model_id"
        )
    if deployment.provider_id is not None:
        problem = deployment_endpoint_problem(provider=deployment.provider, base_url=deployment.base_url)
        if problem is not None:
            raise RegistryError(problem, field="base_url")
        if deployment.speaks_responses and deployment.provider.kind in (
            Provider.Kind.BEDROCK,
            Provider.Kind.ANTHROPIC,
        ):
            raise RegistryError(
                "only an OpenAI-compatible deployment serves OpenAI's /responses", field="speaks_responses"
            )


def deployment_create(**fields: Any) -> Deployment:
    """A new deployment of `fields` (DEPLOYMENT_FIELDS); RegistryError when a rule refuses it."""
    deployment = fields_assign(Deployment(), fields, DEPLOYMENT_FIELDS)
    deployment_check(deployment)
    deployment.save()
    return deployment


def deployment_update(deployment: Deployment, **fields: Any) -> Deployment:
    """Change the given fields (a PATCH gives some); the rules are checked on the result."""
    fields_assign(deployment, fields, DEPLOYMENT_FIELDS)
    deployment_check(deployment)
    deployment.save()
    return deployment
