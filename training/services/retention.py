"""Bounded retention: what a run keeps in the object store, swept after the syncer publishes.

Without it a run writes a global version per fragment and outer step (params, momentum, the
learners' copy and the down-delta: about three times the fragment in fp32) and a delta per
learner push, and deletes nothing. `run_store_sweep` keeps, per fragment:

* the newest K versions (the run config's ``syncer.keep_versions``, default 3): the newest is
  what a resumed syncer, a rejoining learner and an export read, the others spare a learner one
  or two versions behind a full download;
* every version a registered model version points at (ModelVersion.fragment_versions: the
  run's lineage), and every k-th one not yet registered (``register_every_versions``);
* every version published but not yet recorded (GlobalVersionRecord);
* every version a recorded version's evaluation, still to run, will read
  (training.services.evaluation);
* for each live learner (placed, running or lost and being re-placed), the base version of its
  newest delta and every version after it, whose down-deltas bring its copy to the newest,
  while that base is within ``syncer.max_staleness`` of the newest (a learner further behind
  fetches the newest full version, which is always kept);

and deletes the rest, with the consumed deltas except each learner's newest
(training.engine.syncer.Syncer.spent_deltas). Learner checkpoints are pruned by the chunk that
writes one (the newest per learner, and the one before it, which a re-run of the chunk that
wrote the newest reads: training.engine.checkpoint). The sweep logs what it freed and records
the bytes the run's prefix still holds on the run (TrainingRun.store_bytes, shown on its page),
in the run's store and in the stores of its clusters that keep their own (checkpoints).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.db.models import Max

from registry.models import Cluster
from registry.store.cluster_stores import cluster_store, store_identity
from training.models import GlobalVersionRecord, LearnerChunk, ModelVersion, TrainingLearner, TrainingRun
from training.run_engines import RunEngine
from training.services.evaluation import pinned_for_evaluation

if TYPE_CHECKING:
    from training.engine.syncer import Syncer
    from training.engine.transport import ObjectStoreTransport, Retention, Swept

logger = logging.getLogger(__name__)

# A learner in these states still follows the global versions (a lost one is being re-placed
# and continues from its checkpoint's copy).
LIVE_LEARNER_STATES = (
    TrainingLearner.State.PLACED,
    TrainingLearner.State.RUNNING,
    TrainingLearner.State.LOST,
)


def run_retention(*, run: TrainingRun, engine: RunEngine, syncer: Syncer) -> Retention:
    """The run's retention rules filled in from its rows and the syncer's view of the learners."""
    from training.engine.transport import Retention  # lazily: the engine imports torch

    fragments = range(len(engine.fragments))
    recorded: dict[int, int] = dict(
        GlobalVersionRecord.objects.filter(run=run)
        .values("fragment")
        .annotate(v=Max("version"))
        .values_list("fragment", "v")
    )
    pinned: dict[int, set[int]] = {f: set() for f in fragments}
    for versions in ModelVersion.objects.filter(run=run).values_list("fragment_versions", flat=True):
        for f, v in enumerate(versions):
            pinned.setdefault(f, set()).add(int(v))
    # What an evaluation still to run will read (training.services.evaluation).
    for f, versions in pinned_for_evaluation(run, len(engine.fragments)).items():
        pinned.setdefault(f, set()).update(versions)
    every = engine.rc.register_every_versions
    if every > 0:  # due for registration once every fragment reaches them
        for f in fragments:
            pinned[f] |= set(range(every, recorded.get(f, 0) + 1, every))
    live = set(
        TrainingLearner.objects.filter(run=run, state__in=LIVE_LEARNER_STATES).values_list("index", flat=True)
    )
    bases = {f: sorted({b for j, b in syncer.learner_bases(f).items() if j in live}) for f in fragments}
    return Retention(
        keep_newest=engine.rc.keep_versions,
        pinned=pinned,
        learner_bases=bases,
        reach=engine.rc.syncer_config().max_staleness,
        recorded=recorded,
    )


def run_store_sweep(
    *, run: TrainingRun, engine: RunEngine, transport: ObjectStoreTransport, syncer: Syncer
) -> Swept:
    """Delete what the run no longer needs (module docstring), log it, record the bytes left."""
    retention = run_retention(run=run, engine=engine, syncer=syncer)
    spent = {f: syncer.spent_deltas(f) for f in range(len(engine.fragments))}
    swept = transport.sweep(retention, spent)
    if swept.objects:
        logger.info(
            "run %s: retention freed %d bytes in %d objects (%d versions %s, %d deltas); %d bytes kept",
            run.pk,
            swept.bytes_freed,
            swept.objects,
            len(swept.versions),
            swept.versions,
            swept.deltas,
            swept.bytes_kept,
        )
    held = swept.bytes_kept + cluster_store_bytes(run=run)
    TrainingRun.objects.filter(pk=run.pk).update(store_bytes=held)
    return swept


def cluster_store_bytes(*, run: TrainingRun) -> int:
    """What the run holds in its clusters' own stores (their learners' checkpoints): the sizes
    under ``runs/<id>/`` of each store a cluster that ran one of its chunks keeps."""
    from training.engine.transport import object_sizes  # lazily: the engine imports torch

    clusters = Cluster.objects.filter(
        pk__in=LearnerChunk.objects.filter(learner__run=run).values("cluster_id")
    )
    seen: set[str] = set()
    total = 0
    for cluster in clusters.exclude(object_store_url=""):
        identity = store_identity(cluster)
        store = cluster_store(cluster)
        if identity in seen or store is None:
            continue
        seen.add(identity)
        total += sum(object_sizes(store, f"runs/{run.pk}/").values())
    return total
