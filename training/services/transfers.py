"""Data that crosses between object stores, measured and billed as the source cluster's egress.

A cluster may keep its own store (Cluster.object_store_url, registry.store.cluster_stores). Its
learners' checkpoints live there; deltas and global versions live in the run's store (the
installation's, OBJECT_STORE_URL). Two things cross:

* **deltas**, pushed by a learner on a cluster with its own store to the run's store: the bytes
  the chunk's transport counted as sent (LearnerChunk.bytes_sent) are billed at the chunk's
  end as that cluster's egress (`chunk_egress_bill`);
* **a checkpoint**, when a learner moves to a cluster whose store is another one: its next chunk
  copies the newest checkpoint across before starting (`learner_checkpoint_bring`), and the
  bytes are billed as the egress of the cluster whose store held it.

Egress is priced per GB (10^9 bytes) by the cluster's (or its provider's) ``egress_gb`` price
(billing.resource_bills.egress_bill). A cluster without one moves its data all the same; the chunk
records the bytes and the log says it was not billed. Global versions coming down from the
run's store (LearnerChunk.bytes_received) leave the installation's store, which belongs to no
cluster and has no egress price here: measured on the chunk, not billed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.resource_bills import egress_bill
from billing.services import NoPriceError
from registry.models import Cluster
from registry.store.cluster_stores import store_identity
from storage.objectstore import copy_between
from training import selectors
from training.models import LearnerChunk, TrainingLearner, TrainingRun
from training.run_engines import run_checkpoints

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointMove:
    """A checkpoint copied into the store of the cluster that resumes the learner."""

    key: str
    nbytes: int  # bytes that crossed (counted as they were copied)
    from_cluster: Cluster | None  # whose store held it; None: the installation's store


def _learner_clusters(*, run: TrainingRun, index: int) -> list[Cluster]:
    """Every cluster that ran a chunk of the learner, newest chunk first."""
    seen: dict[int, Cluster] = {}
    chunks = (
        LearnerChunk.objects.filter(learner__run=run, learner__index=index)
        .select_related("cluster")
        .order_by("-generation", "-seq")
    )
    for chunk in chunks:
        seen.setdefault(chunk.cluster_id, chunk.cluster)
    return list(seen.values())


def _bill(
    *, cluster: Cluster, nbytes: int, run: TrainingRun, key: str, at: datetime, description: str
) -> bool:
    """One egress row (idempotent on `key`); False, logged, when the cluster has no egress price."""
    try:
        with transaction.atomic():  # a savepoint: a billing error keeps the caller's writes
            egress_bill(
                cluster=cluster,
                nbytes=nbytes,
                subject_type=selectors.RUN_SUBJECT_TYPE,
                subject_id=str(run.pk),
                idempotency_key=key,
                at=at,
                description=description[:200],
                team=run.team_slug,
            )
    except NoPriceError as exc:
        logger.warning("run %s: %d bytes left %s, not billed: %s", run.pk, nbytes, cluster.slug, exc)
        return False
    return True


def learner_checkpoint_bring(
    *, run: TrainingRun, index: int, generation: int, seq: int, cluster: Cluster
) -> CheckpointMove | None:
    """Put the learner's newest checkpoint (written before chunk (generation, seq)) into
    `cluster`'s store when another store holds a newer one than this store does.

    The stores looked at are those of the clusters that ran the learner's chunks. The
    copy streams block by block (storage.objectstore.copy_between); it is billed first, at
    its size, idempotently per (checkpoint, target store), so a chunk killed mid-copy and run
    again copies again without billing twice. The source's copies of that checkpoint and older
    ones are deleted afterwards: the learner's state now lives where it trains.
    """
    here = store_identity(cluster)
    local = run_checkpoints(run, cluster)
    best = local.latest_before(index, generation, seq)
    source = None
    looked = {here}
    for other in _learner_clusters(run=run, index=index):
        identity = store_identity(other)
        if identity in looked:
            continue
        looked.add(identity)
        remote = run_checkpoints(run, other)
        found = remote.latest_before(index, generation, seq)
        if found is not None and (best is None or found > best):
            best, source = found, (other if identity else None, remote)
    if source is None or best is None:
        return None
    from_cluster, remote = source
    key = remote.key(index, *best)
    size = remote.store.size(key)
    if from_cluster is not None:
        _bill(
            cluster=from_cluster,
            nbytes=size,
            run=run,
            key=f"training_run:{run.pk}/learner:{index}/checkpoint-move:{key}/to:{cluster.pk}",
            at=timezone.now(),
            description=f"training run #{run.pk} learner {index}: checkpoint {key.rsplit('/', 1)[-1]} "
            f"({size} bytes) from {from_cluster.slug}'s store to {cluster.slug}'s",
        )
    crossed = copy_between(remote.store, local.store, key)
    if crossed != size:
        logger.error("run %s: checkpoint %s copied %d bytes, listed as %d", run.pk, key, crossed, size)
    for gc in remote.list(index):
        if gc <= best:
            remote.store.delete(remote.key(index, *gc))
    logger.info(
        "run %s learner %s: checkpoint %s moved (%d bytes) from %s's store to %s's",
        run.pk,
        index,
        key,
        crossed,
        from_cluster.slug if from_cluster else "the installation",
        cluster.slug,
    )
    return CheckpointMove(key=key, nbytes=crossed, from_cluster=from_cluster)


def chunk_egress_bill(*, chunk: LearnerChunk, learner: TrainingLearner, occurred_at: datetime) -> bool:
    """Bill the deltas a chunk pushed out of its cluster's own store to the run's store (its
    measured bytes_sent) as the cluster's egress; False when nothing crossed or no price."""
    if not store_identity(chunk.cluster) or chunk.bytes_sent <= 0:
        return False
    return _bill(
        cluster=chunk.cluster,
        nbytes=chunk.bytes_sent,
        run=learner.run,
        key=f"{chunk.billing_key}/egress",
        at=occurred_at,
        description=f"training run #{learner.run_id} learner {learner.index} g{chunk.generation} "
        f"chunk {chunk.seq}: {chunk.bytes_sent} bytes of deltas from {chunk.cluster.slug} to the run's store",
    )
