"""Workflows and their immutable routing-policy versions; prompt retention (opt-in)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Max

from registry.models import (
    MAX_PROMPT_RETENTION_DAYS,
    Deployment,
    RoutingPolicyEntry,
    RoutingPolicyVersion,
    Team,
    Workflow,
)
from registry.selectors import workflow_current_policy
from registry.services.errors import RegistryError
from registry.services.limits import rate_limit_check
from registry.services.records import fields_assign

# What a workflow's update may change: its owner is who created it, its route changes through a
# new policy version (workflow_policy_change, workflow_switch_primary).
WORKFLOW_FIELDS = frozenset(
    {
        "slug",
        "team",
        "description",
        "rpm_limit",
        "tpm_limit",
        "retain_prompts",
        "prompt_retention_days",
        "response_cache_seconds",
        "response_cache_entries",
        "semantic_cache_threshold",
        "semantic_cache_deployment",
    }
)
MAX_CACHE_SECONDS = 30 * 86_400  # a cached answer lives at most 30 days
MAX_CACHE_ENTRIES = 1_000_000
# Semantic matching's cosine-similarity threshold: below 0.5 two prompts have little in common.
SEMANTIC_THRESHOLD_RANGE = (Decimal("0.5"), Decimal("1"))
SEMANTIC_FIELDS = frozenset({"semantic_cache_threshold", "semantic_cache_deployment"})


def _validate_route(deployments: Sequence[Deployment]) -> None:
    if not deployments:
        raise RegistryError("a route needs at least one deployment", field="deployments")
    if len({d.pk for d in deployments}) != len(deployments):
        raise RegistryError("a deployment appears twice in the route", field="deployments")


def workflow_policy_change(
    *,
    workflow: Workflow,
    deployments: Sequence[Deployment],
    author: User,
    reason: str,
    strategy: str = RoutingPolicyVersion.Strategy.PRIORITY,
    quality_floor: Decimal | None = None,
    max_cost_per_request: Decimal | None = None,
    weights: Sequence[int] | None = None,
) -> RoutingPolicyVersion:
    """Create the next immutable policy version of a workflow."""
    _validate_route(deployments)
    if not reason.strip():
        raise RegistryError("say why the route changes", field="reason")
    if weights is not None and len(weights) != len(deployments):
        raise RegistryError("one weight per deployment", field="weights")
    with transaction.atomic():
        # Lock the workflow so two concurrent changes get versions n+1 and n+2.
        Workflow.objects.select_for_update().filter(pk=workflow.pk).first()
        latest = workflow.policy_versions.aggregate(m=Max("version"))["m"] or 0
        policy = RoutingPolicyVersion.objects.create(
            workflow=workflow,
            version=latest + 1,
            strategy=strategy,
            quality_floor=quality_floor,
            max_cost_per_request=max_cost_per_request,
            author=author,
            reason=reason.strip(),
        )
        RoutingPolicyEntry.objects.bulk_create(
            RoutingPolicyEntry(
                policy=policy,
                deployment=d,
                position=i,
                weight=weights[i] if weights is not None else 1,
            )
            for i, d in enumerate(deployments)
        )
    return policy


def workflow_retention_check(*, retain_prompts: bool, prompt_retention_days: int | None) -> None:
    """Keeping prompts needs a retention period of 1..MAX_PROMPT_RETENTION_DAYS days (the
    database's check constraint says the same; this names the field)."""
    if prompt_retention_days is not None and not 1 <= prompt_retention_days <= MAX_PROMPT_RETENTION_DAYS:
        raise RegistryError(
            f"must be between 1 and {MAX_PROMPT_RETENTION_DAYS} days", field="prompt_retention_days"
        )
    if retain_prompts and prompt_retention_days is None:
        raise RegistryError("required when prompts are kept (1 to 365 days)", field="prompt_retention_days")


def workflow_retention_set(
    *, workflow: Workflow, retain_prompts: bool, prompt_retention_days: int | None
) -> Workflow:
    """Opt a workflow in to keeping its prompts (for replays) or out. Opting out deletes the
    kept prompts at once (inference's Workflow post_save receiver, in this transaction)."""
    workflow_retention_check(retain_prompts=retain_prompts, prompt_retention_days=prompt_retention_days)
    workflow_semantic_check(
        threshold=workflow.semantic_cache_threshold,
        deployment=workflow.semantic_cache_deployment,
        retain_prompts=retain_prompts,
        cache_seconds=workflow.response_cache_seconds,
    )
    workflow.retain_prompts = retain_prompts
    workflow.prompt_retention_days = prompt_retention_days
    workflow.save(update_fields=["retain_prompts", "prompt_retention_days"])
    return workflow


def workflow_cache_check(*, seconds: Any, entries: Any) -> None:
    """The response cache's settings: whole numbers within their bounds (each error names its field)."""
    for field, value, high in (
        ("response_cache_seconds", seconds, MAX_CACHE_SECONDS),
        ("response_cache_entries", entries, MAX_CACHE_ENTRIES),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise RegistryError(f"must be a whole number from 0 to {high}", field=field)
    if seconds and not entries:
        raise RegistryError("a cache needs room for at least one answer", field="response_cache_entries")


def workflow_semantic_check(
    *,
    threshold: Any,
    deployment: Deployment | None,
    retain_prompts: bool,
    cache_seconds: int,
    judge_deployment: bool = True,
) -> None:
    """Semantic matching (inference.cache.semantic): a threshold within its range, on a cache that
    is on, with an enabled embeddings deployment to embed prompts, and prompts kept (it stores an
    embedding of each prompt, which says more about a prompt than a hash). Each error names its field."""
    if threshold is None:
        return
    low, high = SEMANTIC_THRESHOLD_RANGE
    number = isinstance(threshold, Decimal) and threshold.is_finite()
    if not number or not low <= threshold <= high:
        raise RegistryError(f"must be a number from {low} to {high}", field="semantic_cache_threshold")
    if not cache_seconds:
        raise RegistryError(
            "semantic matching serves cached answers: turn the response cache on (seconds > 0)",
            field="semantic_cache_threshold",
        )
    if not retain_prompts:
        raise RegistryError(
            "semantic matching stores an embedding of each prompt: it needs prompts kept",
            field="semantic_cache_threshold",
        )
    if deployment is None:
        raise RegistryError(
            "semantic matching needs an embeddings deployment", field="semantic_cache_deployment"
        )
    if judge_deployment and (not deployment.supports_embeddings or not deployment.enabled):
        raise RegistryError(
            f"deployment {deployment.slug} is not an enabled embeddings deployment",
            field="semantic_cache_deployment",
        )


def workflow_check(workflow: Workflow, *, changed: frozenset[str] | None = None) -> None:
    """A workflow's rules, on the state it would be saved with: rate limits within their columns,
    a retention period when prompts are kept, the cache's bounds and semantic matching's needs.
    `changed` (an update's fields; None: all): the embeddings deployment is judged (enabled, an
    embeddings one) only when semantic matching's own fields change, so a deployment disabled
    later does not block every other edit of the workflow (lookups then miss, and say so)."""
    rate_limit_check(rpm_limit=workflow.rpm_limit, tpm_limit=workflow.tpm_limit)
    workflow_retention_check(
        retain_prompts=workflow.retain_prompts, prompt_retention_days=workflow.prompt_retention_days
    )
    workflow_cache_check(seconds=workflow.response_cache_seconds, entries=workflow.response_cache_entries)
    workflow_semantic_check(
        threshold=workflow.semantic_cache_threshold,
        deployment=workflow.semantic_cache_deployment,
        retain_prompts=workflow.retain_prompts,
        cache_seconds=workflow.response_cache_seconds,
        judge_deployment=changed is None or bool(changed & SEMANTIC_FIELDS),
    )


def workflow_update(workflow: Workflow, **fields: Any) -> Workflow:
    """Change the given fields (WORKFLOW_FIELDS; a PATCH gives some); the rules are checked on
    the result. Opting out of keeping prompts deletes the kept ones (workflow_retention_set)."""
    fields_assign(workflow, fields, WORKFLOW_FIELDS)
    workflow_check(workflow, changed=frozenset(fields))
    workflow.save()
    return workflow


def workflow_create(
    *,
    slug: str,
    owner: User,
    deployments: Sequence[Deployment],
    description: str = "",
    team: Team | None = None,
    strategy: str = RoutingPolicyVersion.Strategy.PRIORITY,
    quality_floor: Decimal | None = None,
    max_cost_per_request: Decimal | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    retain_prompts: bool = False,
    prompt_retention_days: int | None = None,
    response_cache_seconds: int = 0,
    response_cache_entries: int = 1000,
    semantic_cache_threshold: Decimal | None = None,
    semantic_cache_deployment: Deployment | None = None,
) -> Workflow:
    _validate_route(deployments)
    rate_limit_check(rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    workflow_retention_check(retain_prompts=retain_prompts, prompt_retention_days=prompt_retention_days)
    workflow_cache_check(seconds=response_cache_seconds, entries=response_cache_entries)
    workflow_semantic_check(
        threshold=semantic_cache_threshold,
        deployment=semantic_cache_deployment,
        retain_prompts=retain_prompts,
        cache_seconds=response_cache_seconds,
    )
    with transaction.atomic():
        workflow = Workflow.objects.create(
            slug=slug,
            owner=owner,
            description=description,
            team=team,
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
            retain_prompts=retain_prompts,
            prompt_retention_days=prompt_retention_days,
            response_cache_seconds=response_cache_seconds,
            response_cache_entries=response_cache_entries,
            semantic_cache_threshold=semantic_cache_threshold,
            semantic_cache_deployment=semantic_cache_deployment,
        )
        workflow_policy_change(
            workflow=workflow,
            deployments=deployments,
            author=owner,
            reason="created",
            strategy=strategy,
            quality_floor=quality_floor,
            max_cost_per_request=max_cost_per_request,
        )
    return workflow


def workflow_switch_primary(
    *, workflow: Workflow, deployment: Deployment, author: User, reason: str
) -> RoutingPolicyVersion:
    """Make `deployment` the first choice; the rest of the route keeps its order."""
    if not deployment.enabled:
        raise RegistryError(f"deployment {deployment.slug} is disabled", field="deployment")
    current = workflow_current_policy(workflow=workflow)
    if current is None:
        order = [deployment]
        strategy: str = RoutingPolicyVersion.Strategy.PRIORITY
        floor = max_cost = None
    else:
        existing = current.ordered_deployments()
        if existing and existing[0].pk == deployment.pk:
            raise RegistryError(f"{deployment.slug} is already the primary deployment", field="deployment")
        order = [deployment] + [d for d in existing if d.pk != deployment.pk]
        strategy = current.strategy
        floor, max_cost = current.quality_floor, current.max_cost_per_request
    return workflow_policy_change(
        workflow=workflow,
        deployments=order,
        author=author,
        reason=reason,
        strategy=strategy,
        quality_floor=floor,
        max_cost_per_request=max_cost,
    )
