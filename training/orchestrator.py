"""The chunk and syncer loops of a training run, with the engine objects they keep between tasks.

The engine (training/engine) is used as is, through the run's engine objects (training.run_engines);
this module keeps what must survive between Celery tasks of the same worker process:

* a learner's `Learner` (model + AdamW state) lives in `_LEARNERS`, keyed (run, learner index,
  generation), so consecutive chunks on the same worker continue where the last one stopped;
  a cache miss (a new worker, a restart, a re-placement) rejoins from the newest global
  versions in the object store with a fresh optimizer, as Decoupled DiLoCo's failed learners do
  (arXiv 2604.21428);
* a run's `Syncer` lives in `_SYNCERS` on the control worker, so grace windows survive between
  ticks; it is rebuilt with `Syncer.resume` whenever the store holds a version it has not seen.

Every database write goes through training.services; tensors go only through the object store.
The engine modules import torch, so they are imported inside the functions that use them.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.utils import timezone

from training import services
from training.models import TrainingRun
from training.run_engines import (
    RunEngine,
    RunKey,
    learner_sampler,
    newest_global,
    run_engine,
    run_engine_forget,
    run_key,
    run_transport,
    torch_threads_limit,
)
from training.services import ChunkOutcome

if TYPE_CHECKING:
    from training.engine.learner import Adopt, Learner
    from training.engine.syncer import Syncer
    from training.engine.transport import ObjectStoreTransport

logger = logging.getLogger(__name__)

# How often a chunk looks at the database (run state) and the store (newer versions) while it
# trains: often enough that a cancel stops billing within about this long, rarely enough that
# an S3 listing per check costs nothing next to the inner steps.
CHECK_SECONDS = 1.0
OWED_CHECK_SECONDS = 0.2
# Delta ids are l<learner>-f<fragment>-s<seq>; a chunk numbers its pushes from
# (generation * CHUNK_SPACE + chunk seq) * PUSH_SPACE, so no two pushes of a learner, in any
# generation or process, share an id (the syncer would skip the second as already consumed).
CHUNK_SPACE = 100_000
PUSH_SPACE = 10_000


# --- Learner chunks -------------------------------------------------------------------------


@dataclass
class LearnerSlot:
    """A learner and its push bookkeeping.

    A fragment that falls due while the learner's previous delta for it is still waiting for
    the syncer (no newer version adopted since) is *owed*, not pushed: its steps stay in the
    next delta, which is sent as soon as a newer version arrives. Pushing again would queue two
    fresh deltas of one learner on one version, and the syncer's token-weighted mean would
    average the two segments instead of adding them, throwing half the work away.
    """

    learner: Learner
    versions: list[int]
    pushed_base: dict[int, int] = field(default_factory=dict)  # fragment -> base version of the last push
    owed: set[int] = field(default_factory=set)


_LEARNERS: dict[tuple[RunKey, int, int], LearnerSlot] = {}


def _learner_for(run: TrainingRun, index: int, generation: int, steps_done: int) -> tuple[LearnerSlot, bool]:
    """The cached learner, or a new one rejoined from the newest global versions (True)."""
    key = (run_key(run), index, generation)
    slot = _LEARNERS.get(key)
    if slot is not None:
        return slot, False
    from training.engine.learner import Learner  # lazily: imports torch

    engine = run_engine(run)
    rc = engine.rc
    transport = run_transport(run)
    params, versions, _ = newest_global(transport, engine.fragments)
    learner = Learner(
        learner_id=index,
        model_cfg=engine.model_cfg,
        inner=rc.inner_config(),
        fragments=engine.fragments,
        sampler=learner_sampler(engine, index=index, generation=generation, steps_done=steps_done),
        init=params,
        versions=versions,
        compression=rc.compression_config(),
    )
    # Continue the learner's lr schedule where its previous incarnation stopped.
    learner.step_count = steps_done
    for stale in [k for k in _LEARNERS if k[0] == key[0] and k[1] == index]:
        del _LEARNERS[stale]
    slot = LearnerSlot(learner=learner, versions=list(versions))
    _LEARNERS[key] = slot
    return slot, True


def forget_run(run: TrainingRun) -> None:
    """Drop a finished run's cached engine objects from this process."""
    key = run_key(run)
    for cached in [k for k in _LEARNERS if k[0] == key]:
        del _LEARNERS[cached]
    _SYNCERS.pop(key, None)
    run_engine_forget(run)


def learner_chunk_execute(
    *, learner_id: int, generation: int, seq: int, worker_hostname: str | None = None
) -> None:
    """Run one chunk of a learner (the `training.learner_chunk` task); claims are in training.services.chunks."""
    # Lazily: the engine modules import torch.
    from training.engine.fragments import due, offsets
    from training.engine.transport import latest_version

    hostname = worker_hostname or socket.gethostname()
    claim = services.learner_chunk_claim(
        learner_id=learner_id, generation=generation, seq=seq, worker_hostname=hostname
    )
    if claim is None:
        return
    run, learner_row, chunk = claim.run, claim.learner, claim.chunk
    started = time.monotonic()
    started_at = timezone.now()
    outcome = ChunkOutcome()
    try:
        torch_threads_limit()
        slot, outcome.rejoined = _learner_for(run, learner_row.index, generation, learner_row.steps)
        engine = run_engine(run)
        rc = engine.rc
        transport = run_transport(run)
        learner = slot.learner
        learner.seq = (generation * CHUNK_SPACE + seq) * PUSH_SPACE
        h = rc.h
        frag_offsets = offsets(rc.fragment_count, h)
        alpha = float(rc.raw["fragments"]["alpha"])
        how: Adopt = "mix" if alpha > 0 else "rebase"
        next_check = started + CHECK_SECONDS
        next_owed_check = started
        tokens_before = learner_row.tokens
        while True:
            outcome.losses.append(learner.train_step())
            if outcome.first_step_at is None:
                outcome.first_step_at = timezone.now()
            outcome.steps += 1
            outcome.tokens += learner.tokens_per_step
            pushed = False
            slot.owed.update(due(learner.step_count, h=h, fragment_offsets=frag_offsets))
            for f in sorted(slot.owed):
                if f in slot.pushed_base and learner.base_version[f] <= slot.pushed_base[f]:
                    continue  # the last delta is still with the syncer
                slot.owed.discard(f)
                slot.pushed_base[f] = learner.base_version[f]
                delta = learner.make_delta(f, now=time.time())
                transport.put_delta(delta)
                outcome.deltas_pushed += 1
                outcome.bytes_sent += delta.nbytes
                pushed = True
            now = time.monotonic()
            if pushed:
                services.learner_chunk_progress(
                    chunk_id=chunk.pk,
                    learner_id=learner_id,
                    steps=outcome.steps,
                    tokens=outcome.tokens,
                    deltas_pushed=outcome.deltas_pushed,
                    bytes_sent=outcome.bytes_sent,
                    tokens_at_push=tokens_before + outcome.tokens,
                )
            if (slot.owed and now >= next_owed_check) or now >= next_check:
                # Adopt newer global versions (rebase keeps the steps since the push). While a
                # push is owed, look more often (an S3 listing per fragment each time).
                next_owed_check = now + OWED_CHECK_SECONDS
                for f in range(len(engine.fragments)):
                    found = transport.versions(f)
                    if found and max(found) > learner.base_version[f]:
                        newer = latest_version(transport, f)
                        if newer is not None:
                            learner.adopt(f, newer.params, newer.version, how=how, alpha=alpha)
            if now >= next_check:
                next_check = now + CHECK_SECONDS
                stop = services.learner_chunk_should_stop(learner_id=learner_id, generation=generation)
                if stop:
                    outcome.stopped_by = stop
                    outcome.stopped_at = time.time()
                    break
            if now - started >= rc.chunk_seconds:
                break
    except Exception as exc:
        logger.exception("learner %s g%s chunk %s failed", learner_id, generation, seq)
        _LEARNERS.pop((run_key(run), learner_row.index, generation), None)
        services.learner_chunk_finish(
            chunk_id=chunk.pk,
            outcome=outcome,
            wall_seconds=time.monotonic() - started,
            started_at=started_at,
            finished_at=timezone.now(),
            error=f"{type(exc).__name__}: {exc}",
        )
        return
    services.learner_chunk_finish(
        chunk_id=chunk.pk,
        outcome=outcome,
        wall_seconds=time.monotonic() - started,
        started_at=started_at,
        finished_at=timezone.now(),
    )
    if outcome.stopped_by.startswith("run "):
        forget_run(run)  # the run is over: free this worker's model, optimizer and corpus


# --- Syncer ---------------------------------------------------------------------------------


_SYNCERS: dict[RunKey, Syncer] = {}


def _syncer_for(run: TrainingRun, engine: RunEngine, transport: ObjectStoreTransport) -> Syncer:
    """The cached syncer if it is at the store's newest versions, else one resumed from the store."""
    from training.engine.syncer import Syncer  # lazily: imports torch

    cached = _SYNCERS.get(run_key(run))
    if cached is not None:
        newest = [max(transport.versions(f) or [0]) for f in range(len(engine.fragments))]
        if newest == cached.version:
            return cached
    syncer = Syncer.resume(
        cfg=engine.rc.syncer_config(),
        outer=engine.rc.outer_config(),
        fragments=engine.fragments,
        transport=transport,
        init=engine.init,
    )
    _SYNCERS[run_key(run)] = syncer
    return syncer


def syncer_tick_execute(*, run_id: int, token: str) -> None:
    """One syncer tick (the `training.syncer_tick` task): merge, publish, record, maybe finish."""
    run = services.syncer_tick_claim(run_id=run_id, token=token)
    if run is None:
        return
    engine = run_engine(run)
    transport = run_transport(run)
    syncer = _syncer_for(run, engine, transport)
    now = time.time()
    syncer.pull(now)
    sizes = {d.id: d.nbytes for queued in syncer.pending for d in queued}
    published = syncer.poll(now)
    if published:
        logger.info("run %s: published %s", run_id, [(v.fragment, v.version) for v in published])
    # Record every stored version the database does not know yet: this tick's and any that an
    # earlier syncer published before it was killed (publishing and recording are not atomic).
    services.global_versions_record_missing(
        run=run,
        engine=engine,
        transport=transport,
        at_hand={(v.fragment, v.version): v for v in published},
        newest=syncer.global_params(),
        delta_bytes=sizes,
    )
    services.model_versions_register_due(run=run, engine=engine, transport=transport)
    run = services.training_run_check_stop(run=run)
    if run.is_finished:
        forget_run(run)
        return
    services.syncer_tick_continue(run_id=run_id, token=token)
