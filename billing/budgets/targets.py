"""Which budgets a spend falls under: a spend's targets, matched on Budget.target_key(), and the rows a budget counts."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Any

from django.db.models import Q

from billing.models import Budget, UsageRecord
from registry.models import Cluster, Provider, Workflow


@dataclass(frozen=True)
class SpendTarget:
    """The dimensions of a spend that budgets are scoped by (named as Budget's attributes): what
    the budget functions take (budget_admit, budget_admission, budget_may_spend,
    budgets_for_target). Build one with spend_target(...) before a spend, spend_target_of_row
    after it."""

    workflow_id: int | None = None
    provider_id: int | None = None
    cluster_id: int | None = None
    team: str = ""
    training_run_id: str = ""
    api_key_id: int | None = None

    def keys(self) -> list[tuple[str, str]]:
        """One (scope, target) key per dimension the spend has; a budget covers the spend when
        its Budget.target_key() is among them."""
        keys = []
        for scope in Budget.SCOPE_FIELDS:
            value = getattr(self, Budget.scope_attname(scope))
            if value not in (None, ""):
                keys.append(Budget.key_for(scope, value))
        return keys


# Budget's attributes naming a target, one per scope: SpendTarget's fields.
SPEND_DIMENSIONS: tuple[str, ...] = tuple(f.name for f in fields(SpendTarget))


def spend_target(
    *,
    workflow: Workflow | None = None,
    provider: Provider | None = None,
    cluster: Cluster | None = None,
    team: str = "",
    training_run_id: str = "",
    api_key_id: int | None = None,
) -> SpendTarget:
    """The target of a spend about to happen, filled in as the ledger will fill in its row."""
    provider_id = provider.pk if provider is not None else None
    if provider_id is None and cluster is not None:
        provider_id = cluster.provider_id
    if not team and workflow is not None:
        team = workflow.team_slug
    return SpendTarget(
        workflow_id=workflow.pk if workflow is not None else None,
        provider_id=provider_id,
        cluster_id=cluster.pk if cluster is not None else None,
        team=team,
        training_run_id=training_run_id,
        api_key_id=api_key_id,
    )


def spend_target_of_row(row: UsageRecord) -> SpendTarget:
    """The target of a spend already in the ledger."""
    return SpendTarget(
        workflow_id=row.workflow_id,
        provider_id=row.provider_id,
        cluster_id=row.cluster_id,
        team=row.team,
        training_run_id=row.subject_id if row.subject_type == "training_run" else "",
        api_key_id=row.api_key_id,
    )


def budget_scope_filter(budget: Budget) -> Q:
    """The ledger rows a budget counts (before period and currency)."""
    if budget.scope == Budget.Scope.TRAINING_RUN:
        return Q(subject_type="training_run", subject_id=budget.training_run_id)
    # The ledger row names workflow, provider, cluster, team and API key as the budget does.
    attname = Budget.scope_attname(budget.scope)
    return Q(**{attname: getattr(budget, attname)})


def budgets_by_key(budgets: list[Budget]) -> dict[tuple[str, str], list[Budget]]:
    """Budgets indexed by their target key, each list in the order given."""
    index: dict[tuple[str, str], list[Budget]] = defaultdict(list)
    for budget in budgets:
        index[budget.target_key()].append(budget)
    return index


# The active budgets, indexed, kept this long per process: admission on /v1 asks on every call
# that a hard budget covers. A budget saved here clears it at once (budget_cache_clear, on
# Budget's post_save/post_delete); another process sees the change within this many seconds.
BUDGET_CACHE_SECONDS = 1.0
_index_cache: tuple[float, dict[tuple[str, str], list[Budget]]] | None = None
_index_lock = threading.Lock()


def budget_cache_clear(**kwargs: Any) -> None:
    global _index_cache
    with _index_lock:
        _index_cache = None


def _active_index() -> dict[tuple[str, str], list[Budget]]:
    global _index_cache
    now = time.monotonic()
    hit = _index_cache
    if hit is not None and now - hit[0] < BUDGET_CACHE_SECONDS:
        return hit[1]
    index = budgets_by_key(list(Budget.objects.filter(active=True).order_by("pk")))
    with _index_lock:
        _index_cache = (now, index)
    return index


def budgets_for_target(*, target: SpendTarget, cached: bool = False) -> list[Budget]:
    """The active budgets a spend with these dimensions counts against, by id. `cached`: from
    this process's copy (at most BUDGET_CACHE_SECONDS old), for the hot admission path."""
    keys = target.keys()
    if not keys:
        return []
    index = (
        _active_index() if cached else budgets_by_key(list(Budget.objects.filter(active=True).order_by("pk")))
    )
    return sorted((b for key in keys for b in index.get(key, [])), key=lambda b: b.pk)


def budget_hard_limit_keys() -> frozenset[tuple[str, str]]:
    """The target keys of every active hard-limit budget: a spend none of whose SpendTarget.keys()
    is among them needs no admission (budget_admit would reserve nothing)."""
    return frozenset(
        budget.target_key()
        for budget in Budget.objects.filter(active=True, hard_limit=True).only("scope", *SPEND_DIMENSIONS)
    )
