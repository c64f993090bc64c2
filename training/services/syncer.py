"""A run's syncer chain (claim, continue, restart) and the record of every published global version."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from registry.claims import lease_renew
from training import dispatch, selectors
from training.models import GlobalVersionRecord, TrainingRun
from training.run_engines import RunEngine

if TYPE_CHECKING:
    from training.engine.messages import GlobalVersion
    from training.engine.transport import ObjectStoreTransport

logger = logging.getLogger(__name__)

SYNCER_TICK_SECONDS = 0.5
# A syncer chain that has not ticked for this long is presumed dead (its control worker was
# killed, its message lost); the supervisor starts a new chain.
SYNCER_STALE_SECONDS = 15.0


def syncer_tick_claim(*, run_id: int, token: str) -> TrainingRun | None:
    """The run, if this tick's chain is the current one and the run is live; else None (a no-op)."""
    # The chain's lease: its token names the holder, syncer_seen_at is its heartbeat (the
    # supervisor starts a new chain, syncer_restart, when it is older than SYNCER_STALE_SECONDS).
    seen = lease_renew(
        TrainingRun,
        pk=run_id,
        states=[TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING],
        heartbeat="syncer_seen_at",
        holder={"syncer_token": token},
    )
    if seen is None:
        return None
    return TrainingRun.objects.get(pk=run_id)


def syncer_tick_continue(*, run_id: int, token: str) -> None:
    """Enqueue the chain's next tick in SYNCER_TICK_SECONDS, while the chain is current and the run live."""
    if TrainingRun.objects.filter(
        pk=run_id, syncer_token=token, state__in=[TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING]
    ).exists():
        dispatch.syncer_tick_enqueue(run_id=run_id, token=token, countdown=SYNCER_TICK_SECONDS)


def syncer_restart(*, run: TrainingRun) -> str:
    """Start a new syncer chain (the old one, if it still runs, stops at its next tick)."""
    token = uuid.uuid4().hex
    # Not a claim (registry.claims): the caller (the supervisor, a resume) has decided the old
    # chain is dead or unwanted, so the new token replaces whatever holds the lease.
    TrainingRun.objects.filter(pk=run.pk).update(syncer_token=token, syncer_seen_at=timezone.now())
    run_id = run.pk
    transaction.on_commit(lambda: dispatch.syncer_tick_enqueue(run_id=run_id, token=token))
    return token


def global_versions_record_missing(
    *,
    run: TrainingRun,
    engine: RunEngine,
    transport: ObjectStoreTransport,
    at_hand: dict[tuple[int, int], GlobalVersion] | None = None,
    delta_bytes: dict[str, int] | None = None,
) -> list[GlobalVersionRecord]:
    """Record each published version the database lacks, exactly once (unique per run/fragment/version).

    Recorded without its eval loss: the evaluator fills that in on a cluster's queue
    (training.services.evaluation), so the control worker only syncs and supervises. The caller
    may hand over what it already holds (the versions it just published, the sizes of the
    deltas it merged) so that nothing is read back from the store twice.
    """
    known: dict[int, set[int]] = {}
    for f, v in GlobalVersionRecord.objects.filter(run=run).values_list("fragment", "version"):
        known.setdefault(f, set()).add(v)
    missing = [
        (f, v)
        for f in range(len(engine.fragments))
        for v in transport.versions(f)
        if v not in known.get(f, set())
    ]
    if not missing:
        return []
    at_hand = at_hand or {}
    sizes = delta_bytes or {}
    p = max(1, len(engine.fragments))
    made = []
    for f, v in sorted(missing, key=lambda fv: (fv[1], fv[0])):
        version = at_hand.get((f, v)) or transport.get_version(f, v)
        # Versions record their deltas' bytes (the sweep deletes consumed deltas); older ones
        # are counted from the deltas.
        bytes_in = int(version.meta.get("bytes_in", 0))
        for delta_id in [] if "bytes_in" in version.meta else version.merged:
            if delta_id in sizes:
                bytes_in += sizes[delta_id]
                continue
            try:
                bytes_in += transport.get_delta(f, delta_id).nbytes
            except Exception:  # a delta removed from the store: count what is left
                logger.warning("run %s: delta %s of f%s v%s is gone", run.pk, delta_id, f, v)
        at_epoch = float(version.meta.get("time") or 0.0)
        now = timezone.now()
        published_at = datetime.fromtimestamp(at_epoch, tz=UTC) if at_epoch > 0 else (run.started_at or now)
        tokens = int(version.meta.get("tokens", 0))
        with transaction.atomic():
            merged_before = (
                GlobalVersionRecord.objects.filter(run=run).aggregate(t=Sum("tokens_merged"))["t"] or 0
            )
            record, created = GlobalVersionRecord.objects.get_or_create(
                run=run,
                fragment=f,
                version=v,
                defaults={
                    "published_at": published_at,
                    # Version 0 was evaluated when the run was placed; later ones by the evaluator.
                    "eval_loss": run.initial_eval_loss if v == 0 else None,
                    "tokens_merged": tokens,
                    # Each fragment's version counts the same tokens: the model saw 1/P of the sum.
                    "tokens_total": (merged_before + tokens) // p,
                    "learners_merged": list(version.meta.get("learners", [])),
                    "staleness": list(version.meta.get("staleness", [])),
                    "bytes_in": bytes_in,
                    "cost_so_far": selectors.run_spend(run_id=run.pk),
                    "wall_seconds": (published_at - run.started_at).total_seconds()
                    if run.started_at
                    else 0.0,
                },
            )
        if created:
            made.append(record)
    return made
