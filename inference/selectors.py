"""Reads for the router and the pages: route plans (cached), rolling quality and latency.

A route plan is everything the router needs about a workflow's current policy version: its
policy and its enabled deployments in the policy's order, as candidates of the routing core
(inference.router.policy) with the deployment (provider, model and hosting cluster loaded), the
adapter target with chaos settings, and the token prices. It is cached per process and
invalidated through a generation counter that every save of a policy, deployment, provider,
chaos config, price or budget bumps (inference.signals): in Redis when REDIS_URL is set, so every web process sees a switch on its
next request; in-process otherwise, with a one-second time limit for the other processes of the
embedded demo.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import Avg
from django.utils import timezone

from billing.budgets import budget_hard_limit_keys
from billing.models import Unit
from billing.selectors import PriceResolver
from inference.adapters.base import Target
from inference.adapters.registry import ADAPTER_FEATURES, ADAPTER_INHERENT, adapter_kind
from inference.breaker.breakers import breakers
from inference.breaker.state import GENERATION_UNKNOWN, redis_unreachable
from inference.models import ChaosConfig, InferenceRequest, QualityRecord
from inference.router.policy import Candidate, Policy, Strategy
from registry.crypto import decrypt_secret
from registry.models import Deployment, RoutingPolicyVersion, Workflow
from registry.outbound.endpoints import deployment_endpoint_problem
from registry.shared_redis.generation import GenerationCounter

GENERATION_KEY = "sy:routegen"  # Redis key of the route-cache generation
LOCAL_PLAN_TTL_S = 1.0
QUALITY_WINDOW = 20  # the last N scores of a deployment make its rolling quality
QUALITY_TTL_S = 5.0
LATENCY_TTL_S = 2.0


@dataclass(frozen=True, kw_only=True)
class PlanEntry(Candidate):
    """A candidate of the route (inference.router.policy) with what calling it needs: the deployment
    (provider, model and hosting cluster loaded) and its adapter target."""

    deployment: Deployment
    target: Target
    # Prices of the token kinds providers report apart ($/1M; None: billed as input / output).
    cached_input_price: Decimal | None = None
    cache_write_price: Decimal | None = None
    reasoning_price: Decimal | None = None
    # A batch job's token prices ($/1M; None: billed at the input / output price).
    batch_input_price: Decimal | None = None
    batch_output_price: Decimal | None = None
    # What it can serve (Deployment.supports_*, limited to what its adapter maps, and what its
    # adapter serves whatever is declared: adapters.registry.ADAPTER_INHERENT).
    capabilities: frozenset[str] = frozenset()
    max_context_tokens: int | None = None


@dataclass
class RoutePlan:
    workflow_id: int
    policy_id: int | None  # None: a one-deployment plan (evals, judges), not a workflow route
    version: int
    policy: Policy
    entries: list[PlanEntry]
    generation: int = 0
    built_at: float = field(default_factory=time.monotonic)
    # Warm price versions of the route's deployments, handed to the ledger writer (a PriceBook
    # save drops the plan, and with it this resolver).
    prices: PriceResolver = field(default_factory=PriceResolver)
    # (scope, target) of every active hard-limit budget: a call whose spend falls under none of
    # them needs no budget admission (it would admit without reserving anything).
    hard_budget_keys: frozenset[tuple[str, str]] = frozenset()
    # The policy's RoutingPolicyVersion.max_cost_per_request: no call whose estimate is above it.
    max_cost_per_request: Decimal | None = None

    def is_current(self, generation_value: int, *, shared: bool) -> bool:
        if generation_value == GENERATION_UNKNOWN or self.generation != generation_value:
            return False
        return shared or time.monotonic() - self.built_at < LOCAL_PLAN_TTL_S


class _Generation:
    """The route-cache generation: shared through Redis (REDIS_URL), or this process's own
    count of its bumps (the embedded demo, whose plans also expire after LOCAL_PLAN_TTL_S)."""

    def __init__(self) -> None:
        self.counter = GenerationCounter(
            GENERATION_KEY, url=settings.REDIS_URL, name="route generation", on_unreachable=redis_unreachable
        )

    @property
    def shared(self) -> bool:
        return self.counter.shared

    def read(self) -> int:
        """The shared generation; GENERATION_UNKNOWN while Redis is unreachable (plans rebuild)."""
        if not self.counter.shared:
            return self.counter.local
        value = self.counter.read()
        if value is None:
            return GENERATION_UNKNOWN
        return int(value) if value else 0

    def bump(self) -> None:
        """Move the generation. A save must not fail because Redis is away: plans built while it
        is away are never current (GENERATION_UNKNOWN), and the next bump after it returns
        reaches every process."""
        self.counter.bump()


_gen: _Generation | None = None
_plans: dict[int, RoutePlan] = {}
_deployment_plans: dict[tuple[int, int], RoutePlan] = {}
_lock = threading.Lock()


@dataclass
class FoldCache:
    """What folding journaled requests reads (inference.recording.fold): prices and the rows of
    deployments and workflows, kept by this process's folds until the route-cache generation
    moves (every save of a price, deployment, provider or workflow moves it)."""

    generation: int
    prices: PriceResolver = field(default_factory=PriceResolver)
    deployments: dict[int, Deployment] = field(default_factory=dict)
    workflows: dict[int, Workflow] = field(default_factory=dict)


_fold_cache: FoldCache | None = None


def fold_cache() -> FoldCache:
    """The current FoldCache (one generation read, a Redis GET, per fold)."""
    global _fold_cache
    current = generation().read()
    cache = _fold_cache
    if cache is None or current == GENERATION_UNKNOWN or cache.generation != current:
        cache = _fold_cache = FoldCache(current)
    return cache


def generation() -> _Generation:
    global _gen
    if _gen is None:
        _gen = _Generation()
    return _gen


def route_cache_invalidate() -> None:
    """Called on every save that can change a route (inference.signals)."""
    with _lock:
        _plans.clear()
        _deployment_plans.clear()
        _quality_cache.clear()
    generation().bump()


# --- Building plans ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenPrices:
    """A deployment's per-token prices in force ($/1M tokens; None: no such price)."""

    input: Decimal | None
    output: Decimal | None
    currency: str  # of the prices found; USD when there is none
    cached_input: Decimal | None = None
    cache_write: Decimal | None = None
    reasoning: Decimal | None = None
    batch_input: Decimal | None = None
    batch_output: Decimal | None = None


def deployment_token_prices(*, deployment: Deployment, at: datetime, prices: PriceResolver) -> TokenPrices:
    """The input and output token prices in force at `at` for the deployment (its own price,
    else its provider's), as the ledger will price its usage."""

    def price(unit: Unit) -> Decimal | None:
        found = prices.resolve(
            unit=unit, at=at, deployment_id=deployment.pk, provider_id=deployment.provider_id
        )
        return found.unit_price if found is not None else None

    found_in = prices.resolve(
        unit=Unit.INPUT_TOKENS_1M, at=at, deployment_id=deployment.pk, provider_id=deployment.provider_id
    )
    found_out = prices.resolve(
        unit=Unit.OUTPUT_TOKENS_1M, at=at, deployment_id=deployment.pk, provider_id=deployment.provider_id
    )
    priced = found_in or found_out
    return TokenPrices(
        input=found_in.unit_price if found_in else None,
        output=found_out.unit_price if found_out else None,
        currency=priced.currency if priced is not None else "USD",
        cached_input=price(Unit.CACHED_INPUT_TOKENS_1M),
        cache_write=price(Unit.CACHE_WRITE_TOKENS_1M),
        reasoning=price(Unit.REASONING_TOKENS_1M),
        batch_input=price(Unit.BATCH_INPUT_TOKENS_1M),
        batch_output=price(Unit.BATCH_OUTPUT_TOKENS_1M),
    )


def _target(d: Deployment, chaos: ChaosConfig | None) -> Target:
    provider = d.provider
    secret = decrypt_secret(provider.credentials_encrypted) if provider.credentials_encrypted else ""
    extra: dict[str, object] = {}
    if chaos is not None and chaos.enabled:
        extra["chaos"] = {
            "error_rate": chaos.error_rate,
            "status_codes": list(chaos.status_codes or []),
            "latency_ms": chaos.latency_ms,
            "malformed_rate": chaos.malformed_rate,
        }
    # Checked again here, not only where deployments are saved: a row written before the rule,
    # or left outside after an admin narrowed the provider's endpoints, is refused, not called.
    refused = deployment_endpoint_problem(provider=provider, base_url=d.base_url)
    kind = adapter_kind(provider.kind)
    if d.speaks_responses and kind == "openai-compatible":
        extra["responses_api"] = True  # /v1/responses requests go to its /responses as written
    return Target(
        deployment_id=d.pk,
        slug=d.slug,
        kind=kind,
        base_url="" if refused else (d.base_url or provider.base_url).rstrip("/"),
        provider_model_id=d.provider_model_id or d.model.slug,
        region=provider.region,
        credentials="" if refused else secret,
        extra=extra,
        allow_private=provider.allow_private_network,
        refused=f"base URL outside the provider's endpoints: {refused}" if refused else "",
    )


def _plan_entry(
    d: Deployment,
    *,
    position: int,
    weight: int,
    chaos: ChaosConfig | None,
    at: datetime,
    prices: PriceResolver,
) -> PlanEntry:
    found = deployment_token_prices(deployment=d, at=at, prices=prices)
    target = _target(d, chaos)
    declared = {
        name
        for name, flag in (
            ("tools", d.supports_tools),
            ("json_schema", d.supports_json_schema),
            ("vision", d.supports_vision),
            ("embeddings", d.supports_embeddings),
        )
        if flag
    }
    return PlanEntry(
        deployment_id=d.pk,
        slug=d.slug,
        position=position,
        weight=weight,
        input_price=found.input,
        output_price=found.output,
        currency=found.currency,
        deployment=d,
        target=target,
        cached_input_price=found.cached_input,
        cache_write_price=found.cache_write,
        reasoning_price=found.reasoning,
        batch_input_price=found.batch_input,
        batch_output_price=found.batch_output,
        capabilities=(frozenset(declared) & ADAPTER_FEATURES[target.kind]) | ADAPTER_INHERENT[target.kind],
        max_context_tokens=d.max_context_tokens,
    )


def route_plan_build(*, workflow_id: int, generation_value: int = 0) -> RoutePlan | None:
    """Load the workflow's current policy version into a plan (three queries)."""
    policy = (
        RoutingPolicyVersion.objects.filter(workflow_id=workflow_id)
        .order_by("-version")
        .only("id", "version", "strategy", "quality_floor", "max_cost_per_request", "workflow_id")
    ).first()
    if policy is None:
        return None
    entries = list(
        policy.entries.select_related(
            "deployment__provider", "deployment__model", "deployment__hosting_cluster"
        ).order_by("position")
    )
    deployment_ids = [e.deployment_id for e in entries]
    chaos = {c.deployment_id: c for c in ChaosConfig.objects.filter(deployment_id__in=deployment_ids)}
    prices = PriceResolver()
    now = timezone.now()
    plan_entries = [
        _plan_entry(
            e.deployment,
            position=e.position,
            weight=e.weight,
            chaos=chaos.get(e.deployment_id),
            at=now,
            prices=prices,
        )
        for e in entries
        if e.deployment.enabled and e.deployment.provider.enabled
    ]
    floor = float(policy.quality_floor) if policy.quality_floor is not None else None
    return RoutePlan(
        workflow_id=workflow_id,
        policy_id=policy.pk,
        version=policy.version,
        policy=Policy(strategy=policy.strategy, quality_floor=floor),
        entries=plan_entries,
        generation=generation_value,
        prices=prices,
        hard_budget_keys=budget_hard_limit_keys(),
        max_cost_per_request=policy.max_cost_per_request,
    )


def deployment_plan(*, workflow_id: int, deployment_id: int) -> RoutePlan | None:
    """A plan of exactly one deployment (eval runs and judges call one deployment, whatever the
    workflow's route says); cached like route plans. None if it does not exist or is disabled."""
    gen = generation()
    current = gen.read()
    key = (workflow_id, deployment_id)
    plan = _deployment_plans.get(key)
    if plan is not None and plan.is_current(current, shared=gen.shared):
        return plan
    d = (
        Deployment.objects.select_related("provider", "model", "hosting_cluster")
        .filter(pk=deployment_id, enabled=True, provider__enabled=True)
        .first()
    )
    if d is None:
        return None
    prices = PriceResolver()
    entry = _plan_entry(
        d,
        position=0,
        weight=1,
        chaos=ChaosConfig.objects.filter(deployment=d).first(),
        at=timezone.now(),
        prices=prices,
    )
    plan = RoutePlan(
        workflow_id=workflow_id,
        policy_id=None,
        version=0,
        policy=Policy(strategy=Strategy.PRIORITY),
        entries=[entry],
        generation=current,
        prices=prices,
        hard_budget_keys=budget_hard_limit_keys(),
    )
    with _lock:
        _deployment_plans[key] = plan
    return plan


def route_plan_refresh(*, workflow_id: int, generation_value: int) -> RoutePlan | None:
    plan = route_plan_build(workflow_id=workflow_id, generation_value=generation_value)
    with _lock:
        if plan is None:
            _plans.pop(workflow_id, None)
        else:
            _plans[workflow_id] = plan
    return plan


def route_plan_cached(*, workflow_id: int) -> RoutePlan | None:
    """The cached plan without asking whether it is current (the router checks the generation
    in the same Redis round trip as the breakers, see inference.router)."""
    plan = _plans.get(workflow_id)
    if plan is not None:
        return plan
    return route_plan_refresh(workflow_id=workflow_id, generation_value=generation().read())


def route_plan(*, workflow_id: int) -> RoutePlan | None:
    """The current plan, rebuilt when the generation moved (one Redis GET per call)."""
    gen = generation()
    current = gen.read()
    plan = _plans.get(workflow_id)
    if plan is not None and plan.is_current(current, shared=gen.shared):
        return plan
    return route_plan_refresh(workflow_id=workflow_id, generation_value=current)


# --- Rolling quality and latency ----------------------------------------------------------------

_quality_cache: dict[tuple[int, tuple[int, ...]], tuple[float, dict[int, float | None]]] = {}


def rolling_quality(*, workflow_id: int, deployment_ids: Sequence[int]) -> dict[int, float | None]:
    """Mean of each deployment's last QUALITY_WINDOW scores for this workflow (or workflow-less
    scores such as shared eval sets); None when it has none. Cached a few seconds."""
    key = (workflow_id, tuple(deployment_ids))
    hit = _quality_cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < QUALITY_TTL_S:
        return hit[1]
    out: dict[int, float | None] = {}
    for d in deployment_ids:
        recent = QualityRecord.objects.filter(deployment_id=d, workflow_id__in=[workflow_id]).order_by(
            "-created_at"
        )[:QUALITY_WINDOW]
        rows = list(recent.values_list("score", flat=True))
        if not rows:
            shared = QualityRecord.objects.filter(deployment_id=d, workflow__isnull=True).order_by(
                "-created_at"
            )
            rows = list(shared[:QUALITY_WINDOW].values_list("score", flat=True))
        out[d] = float(sum(rows) / len(rows)) if rows else None
    with _lock:
        _quality_cache[key] = (time.monotonic(), out)
    return out


_latency_cache: dict[tuple[int, ...], tuple[float, dict[int, float | None]]] = {}


def rolling_p50(*, deployment_ids: Sequence[int]) -> dict[int, float | None]:
    """Median latency (ms) of each deployment's recent successful calls, across processes."""
    key = tuple(deployment_ids)
    hit = _latency_cache.get(key)
    if hit is not None and time.monotonic() - hit[0] < LATENCY_TTL_S:
        return hit[1]
    samples = breakers().latencies(deployment_ids)
    out = {d: (statistics.median(v) if v else None) for d, v in samples.items()}
    _latency_cache[key] = (time.monotonic(), out)
    return out


def rolling_caches_clear() -> None:
    with _lock:
        _quality_cache.clear()
        _latency_cache.clear()


# --- Pages and reports -------------------------------------------------------------------------


def deployment_quality_mean(*, deployment: Deployment, since: datetime | None = None) -> float | None:
    rows = QualityRecord.objects.filter(deployment=deployment)
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    value = rows.aggregate(m=Avg("score"))["m"]
    return float(value) if value is not None else None


def workflow_requests(*, workflow: Workflow, limit: int = 100) -> list[InferenceRequest]:
    return list(
        InferenceRequest.objects.filter(workflow=workflow)
        .select_related("deployment")
        .order_by("-created_at")[:limit]
    )
