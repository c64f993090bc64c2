"""Invalidate cached route plans whenever something a route depends on is saved.

Bumped at once and again after the transaction commits: at once so this process stops using
the old plan, after commit so that no other process keeps a plan it rebuilt from the
not-yet-committed state under the new generation.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from billing.models import Budget, PriceBook
from inference.models import ChaosConfig
from inference.selectors import route_cache_invalidate
from stack.registry.models import Deployment, Provider, RoutingPolicyEntry, RoutingPolicyVersion, Workflow


def _invalidate(**kwargs: Any) -> None:
    route_cache_invalidate()
    transaction.on_commit(route_cache_invalidate)


def connect() -> None:
    """Connect the invalidation to every model a route plan reads (InferenceConfig.ready)."""
    for model in (
        RoutingPolicyVersion,
        RoutingPolicyEntry,
        Deployment,
        Provider,
        ChaosConfig,
        PriceBook,
        Budget,
        Workflow,  # its slug and team are on ledger rows the journal folds (selectors.FoldCache)
    ):
        post_save.connect(_invalidate, sender=model, dispatch_uid=f"inference-route-cache-{model.__name__}")
        post_delete.connect(
            _invalidate, sender=model, dispatch_uid=f"inference-route-cache-del-{model.__name__}"
        )
