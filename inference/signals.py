"""Invalidate cached route plans whenever something a route depends on is saved.

Bumped at once and again after the transaction commits: at once so this process stops using
the old plan, after commit so that no other process keeps a plan it rebuilt from the
not-yet-committed state under the new generation.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save

from billing.models import Budget, PriceBook
from inference.cache import semantic_forget
from inference.models import ChaosConfig, GatewayFile
from inference.retention import retained_prompts_forget
from inference.selectors import route_cache_invalidate
from registry.models import Deployment, Provider, RoutingPolicyEntry, RoutingPolicyVersion, Workflow


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
    post_save.connect(_forget_prompts, sender=Workflow, dispatch_uid="inference-retention-opt-out")
    post_save.connect(_files_follow_team, sender=Workflow, dispatch_uid="inference-files-follow-team")
    pre_save.connect(_semantic_was_on, sender=Workflow, dispatch_uid="inference-semantic-cache-was-on")
    post_save.connect(_forget_embeddings, sender=Workflow, dispatch_uid="inference-semantic-cache-off")


def _files_follow_team(sender: Any, instance: Workflow, created: bool, **kwargs: Any) -> None:
    """A workflow moved to another team takes its batches' output files along: the old team no
    longer sees its answers, the new one does (inference.gateway.files)."""
    if not created:
        moved = GatewayFile.objects.filter(workflow_id=instance.pk)
        if instance.team_id is None:
            moved = moved.filter(team__isnull=False)
        else:
            moved = moved.exclude(team_id=instance.team_id)
        moved.update(team_id=instance.team_id)


def _forget_prompts(sender: Any, instance: Workflow, created: bool, **kwargs: Any) -> None:
    """A workflow that does not keep prompts has none kept: opting out deletes them at once
    (inference.retention), in the transaction that saved the setting."""
    if not created and not instance.retain_prompts:
        retained_prompts_forget(workflow_id=instance.pk)


def _semantic_was_on(sender: Any, instance: Workflow, **kwargs: Any) -> None:
    """Note whether the saved row had semantic matching on (one indexed read, before the save)."""
    was_on = instance.pk is not None and (
        Workflow.objects.filter(pk=instance.pk, semantic_cache_threshold__isnull=False).exists()
    )
    instance._semantic_was_on = was_on  # type: ignore[attr-defined]


def _forget_embeddings(sender: Any, instance: Workflow, created: bool, **kwargs: Any) -> None:
    """A workflow without semantic matching keeps no embedding of its prompts (inference.cache.
    semantic): turning it off forgets them once the setting is committed. (A process that
    still holds the workflow's row for a few seconds may add one more; it is never read while
    matching is off and expires with the cache's time.)"""
    if getattr(instance, "_semantic_was_on", False) and instance.semantic_cache_threshold is None:
        workflow_id = instance.pk
        transaction.on_commit(lambda: semantic_forget(workflow_id))
