"""The chunk and syncer loops of a training run, with the engine objects they keep between tasks.

The engine (training/engine) is used as is, through the run's engine objects (training.run_engines);
this module keeps what must survive between Celery tasks:

* a learner's state (model, AdamW moments, schedule position, sampler, anchors, held copy) is
  checkpointed at the end of every chunk (training.engine.checkpoint, keyed by the chunk that
  wrote it), so chunk c + 1 continues it in any worker process that picks it up, on this or
  (re-placed) another cluster; the process that ran chunk c keeps it in `_LEARNERS`. Only a
  learner with no checkpoint rejoins from the newest global versions with a fresh optimizer,
  as Decoupled DiLoCo's failed learners do (arXiv 2604.21428);
* a run's `Syncer` lives in `_SYNCERS` on the control worker, so grace windows survive between
  ticks; it is rebuilt with `Syncer.resume` whenever the store holds a version it has not seen
  (reading the newest version of each fragment and the pending deltas, whatever the run's
  length). A tick that published sweeps the store (training.services.retention).

Chunks stay idempotent: a chunk run again after a crash restores the checkpoint written before
it started (never its first attempt's), and what a dead chunk pushed is neither pushed nor
trained again (training.run_pushes.reconcile_pushes). Versions come down as down-deltas from
the copy the learner holds (`_fetch_versions`), adopted no earlier than τ inner steps after
the push. A chunk runs on the devices its worker let it own (training.run_ranks.chunk_devices).

Every database write goes through training.services; tensors go only through the object store.
The engine modules import torch, so they are imported inside the functions that use them.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.utils import timezone

from registry.models import Cluster
from registry.tracing import span_attributes
from storage.objectstore import ObjectNotFoundError
from training import services
from training.models import LearnerChunk, TrainingRun
from training.run_engines import (
    RunEngine,
    RunKey,
    learner_sampler,
    newest_global,
    run_checkpoints,
    run_engine,
    run_engine_forget,
    run_key,
    run_transport,
    torch_threads_limit,
)
from training.run_pushes import LearnerSlot, push, push_before_interruption, pushes_record, reconcile_pushes
from training.run_ranks import chunk_devices, learner_device, learner_ranks_release, learner_ranks_start
from training.services import ChunkOutcome

if TYPE_CHECKING:
    import torch

    from training.engine.config import CompressionKind
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


# A learner more than this many versions behind fetches the full version instead of the chain
# of down-deltas: the chain would cost about as much (4 bytes per value / bytes per value).
DOWN_CHAIN_LIMIT: dict[str, int] = {"fp32": 1, "bf16": 1, "int8": 3, "4bit": 7, "fp4_e3m0": 7}


@dataclass
class LearnerStart:
    slot: LearnerSlot
    source: str  # LearnerChunk.StateSource
    checkpoint_key: str = ""
    bytes_received: int = 0  # a rejoin downloads the full global version
    moved: services.CheckpointMove | None = None  # the checkpoint came from another cluster's store


_LEARNERS: dict[tuple[RunKey, int], LearnerSlot] = {}


def _learner_for(
    run: TrainingRun,
    index: int,
    generation: int,
    seq: int,
    steps_done: int,
    cluster: Cluster,
    device: torch.device | None = None,
) -> LearnerStart:
    """The learner as chunk (generation, seq) on `cluster` must start it, on `device` (None:
    the default): the state the previous chunk ended with.

    From this process's memory when it ran that chunk, else from the newest checkpoint written
    by an earlier chunk (of this generation or, for a re-placed learner, an earlier one; copied
    into this cluster's store first when another cluster's store holds it), else rejoined from
    the newest global versions with a fresh optimizer.
    """
    key = (run_key(run), index)
    cached = _LEARNERS.get(key)
    if (
        cached is not None
        and cached.done == (generation, seq - 1)
        and device in (None, cached.learner.device)
    ):
        return LearnerStart(slot=cached, source=LearnerChunk.StateSource.MEMORY)
    _LEARNERS.pop(key, None)
    # Lazily: the engine modules import torch.
    from training.engine.learner import Learner

    engine = run_engine(run)
    rc = engine.rc
    # A fresh byte stream per generation, or the text shard fast-forwarded past `steps_done`
    # (run_engines.learner_sampler); a checkpoint restores the stream's exact position instead.
    sampler = learner_sampler(engine, index=index, generation=generation, steps_done=steps_done)
    learner = Learner(
        learner_id=index,
        model_cfg=engine.model_cfg,
        inner=rc.inner_config(),
        fragments=engine.fragments,
        sampler=sampler,
        init=engine.init,
        compression=rc.compression_config(),
        ranks=rc.ranks,
        device=device,
    )
    moved = services.learner_checkpoint_bring(
        run=run, index=index, generation=generation, seq=seq, cluster=cluster
    )
    checkpoints = run_checkpoints(run, cluster)
    found = checkpoints.latest_before(index, generation, seq)
    if found is not None:
        extra = checkpoints.load(index, *found, learner)
        pushed = extra.get("pushed_base", {})
        slot = LearnerSlot(
            learner=learner,
            pushed_base={int(f): int(v) for f, v in pushed.items()} if isinstance(pushed, dict) else {},
            owed={int(f) for f in extra.get("owed", [])} if isinstance(extra.get("owed"), list) else set(),
        )
        start = LearnerStart(
            slot=slot,
            source=LearnerChunk.StateSource.CHECKPOINT,
            checkpoint_key=checkpoints.key(index, *found),
            moved=moved,
        )
    else:
        transport = run_transport(run)
        params, versions, _ = newest_global(transport, engine.fragments, held=True)
        learner.rejoin(params, versions)
        # Continue the lr schedule (and the sampler: learner_sampler skipped as many steps).
        learner.step_count = learner.windows = steps_done
        start = LearnerStart(
            slot=LearnerSlot(learner=learner),
            source=LearnerChunk.StateSource.REJOIN,
            # Measured: every version blob read (a full version: the syncer's whole state).
            bytes_received=transport.bytes_down,
        )
    _LEARNERS[key] = start.slot
    return start


def _fetch_versions(
    learner: Learner, transport: ObjectStoreTransport, fragment: int, down: CompressionKind
) -> int:
    """Bring the learner's held copy of a fragment to the newest version; returns the bytes read
    from the store for it (measured by the transport, blob headers included)."""
    before = transport.bytes_down
    for attempt in range(3):
        found = transport.versions(fragment)
        newest = max(found) if found else 0
        have = learner.held_version[fragment]
        if newest <= have:
            break
        if newest - have <= DOWN_CHAIN_LIMIT[down]:
            try:
                for v in range(have + 1, newest + 1):
                    learner.receive(transport.get_down(fragment, v))
                break
            except LookupError:  # a version without a down-delta (written before they
                pass  # existed), or one the retention sweep deleted: the full newest instead
        try:
            full = transport.get_held(fragment, newest)  # its mirror only, not params and momentum
        except ObjectNotFoundError:
            if attempt == 2:
                raise
            continue  # swept since the listing (a newer one was published): list again
        learner.receive_full(fragment, full.held, newest)
        break
    return transport.bytes_down - before


def forget_run(run: TrainingRun) -> None:
    """Drop a finished run's cached engine objects from this process."""
    key = run_key(run)
    for cached in [k for k in _LEARNERS if k[0] == key]:
        del _LEARNERS[cached]
    _SYNCERS.pop(key, None)
    learner_ranks_release(key)
    run_engine_forget(run)


def learner_chunk_execute(
    *, learner_id: int, generation: int, seq: int, worker_hostname: str | None = None
) -> None:
    """Run one chunk of a learner (the `training.learner_chunk` task); claims are in training.services.chunks."""
    # Lazily: the engine modules import torch.
    from training.engine.fragments import due, offsets

    hostname = worker_hostname or socket.gethostname()
    claim = services.learner_chunk_claim(
        learner_id=learner_id, generation=generation, seq=seq, worker_hostname=hostname
    )
    if claim is None:
        return
    run, learner_row, chunk = claim.run, claim.learner, claim.chunk
    # The task's span (when tracing is on) names the run it trains for.
    span_attributes(training_run_id=run.pk, learner=learner_row.index, generation=generation, seq=seq)
    # Billed from the claim (chunk.started_at), the instant the budget deadline accrues from
    # (training.selectors.run_budget_left): the claim's own transaction is chunk time too.
    started_at = chunk.started_at
    started = time.monotonic() - max(0.0, (timezone.now() - started_at).total_seconds())
    outcome = ChunkOutcome()
    index = learner_row.index
    ranks = None  # the learner's other ranks (training.run_ranks), while they run
    try:
        torch_threads_limit()
        devices = chunk_devices(chunk.devices)  # the GPUs its worker let it own, rank by rank
        begin = _learner_for(
            run,
            index,
            generation,
            seq,
            learner_row.steps,
            chunk.cluster,
            learner_device(run_engine(run), devices),
        )
        slot = begin.slot
        outcome.state_source, outcome.checkpoint_key = begin.source, begin.checkpoint_key
        outcome.bytes_received = begin.bytes_received
        if begin.moved is not None:
            outcome.checkpoint_moved_bytes = begin.moved.nbytes
            outcome.checkpoint_moved_from_id = (
                begin.moved.from_cluster.pk if begin.moved.from_cluster else None
            )
        engine = run_engine(run)
        rc = engine.rc
        transport = run_transport(run)
        learner = slot.learner
        first_seq = (generation * CHUNK_SPACE + seq) * PUSH_SPACE
        reconcile_pushes(slot, transport, index, first_seq, rejoined=begin.source == "rejoin")
        ranks = learner_ranks_start(
            run=run_key(run),
            engine=engine,
            learner=learner,
            index=index,
            generation=generation,
            steps_done=learner_row.steps,
            devices=devices,
        )
        learner.rank_skip = 0  # the ranks that started skipped them
        if ranks is not None:
            outcome.ranks_start = (
                LearnerChunk.RankStart.KEPT if ranks.kept else LearnerChunk.RankStart.STARTED
            )
            outcome.ranks_start_seconds = round(ranks.start_seconds, 3)
        h = rc.h
        frag_offsets = offsets(rc.fragment_count, h)
        alpha = float(rc.raw["fragments"]["alpha"])
        tau = int(rc.raw["fragments"]["overlap"])
        down_kind = rc.compression_config().down_kind
        how: Adopt = "mix" if alpha > 0 else "rebase"
        # chunk_seconds is seconds of inner steps: its clock starts once the learner (and its
        # other ranks, a Python process each that imports torch: seconds on a loaded machine)
        # can train. Counted from the claim, a learner of several ranks whose start took longer
        # than chunk_seconds did one step per chunk. Billing still counts from the claim.
        training_from = time.monotonic()
        next_check = training_from + CHECK_SECONDS
        next_owed_check = training_from
        tokens_before = learner_row.tokens
        budget_at = services.learner_chunk_budget_deadline(run_id=run.pk)  # checked every step
        while True:
            outcome.losses.append(learner.train_step())
            if outcome.first_step_at is None:
                outcome.first_step_at = timezone.now()
            outcome.steps += 1
            outcome.tokens += learner.tokens_per_step
            pushed = False
            slot.owed.update(due(learner.step_count, h=h, fragment_offsets=frag_offsets))
            for f in sorted(slot.owed):
                if slot.may_push(f):  # not while the last delta is still with the syncer
                    push(slot, transport, outcome, f)
                    pushed = True
            now = time.monotonic()
            if pushed:
                pushes_record(chunk.pk, learner_id, outcome, tokens_before + outcome.tokens)
            # A window closing this step is a reason to look at the store now (Streaming
            # DiLoCo mixes the merged fragment in exactly τ steps after its push).
            closing = tau > 0 and any(
                at is not None and learner.step_count == at + tau for at in learner.pushed_at
            )
            if (slot.owed and now >= next_owed_check) or now >= next_check or closing:
                # Fetch newer global versions (down-deltas onto the held copy). While a push is
                # owed, look more often (an S3 listing per fragment each time).
                next_owed_check = now + OWED_CHECK_SECONDS
                for f in range(len(engine.fragments)):
                    outcome.bytes_received += _fetch_versions(learner, transport, f, down_kind)
            for f in range(len(engine.fragments)):
                # Adopt (rebase keeps the steps since the push; mix is Streaming DiLoCo's α)
                # what is held, once the fragment's overlap window has closed.
                if learner.may_adopt(f, tau):
                    learner.adopt_held(f, how=how, alpha=alpha)
            if now >= next_check or (budget_at is not None and time.time() >= budget_at):
                next_check = now + CHECK_SECONDS
                budget_at = services.learner_chunk_budget_deadline(run_id=run.pk)  # others spend too
                stop = services.learner_chunk_should_stop(learner_id=learner_id, generation=generation)
                if not stop and budget_at is not None and time.time() >= budget_at:
                    stop = services.BUDGET_REACHED  # stopped like a chunk's end: a checkpoint
                if stop:
                    outcome.stopped_by = stop
                    outcome.stopped_at = time.time()
                    if stop.startswith(services.INTERRUPTED):
                        push_before_interruption(
                            slot, transport, outcome, chunk.pk, learner_id, tokens_before + outcome.tokens
                        )
                    break
            if now - training_from >= rc.chunk_seconds:
                break
        if ranks is not None:
            ranks.finish()  # their sampler positions go into the checkpoint below
            ranks = None  # the session is over; this process keeps the group for the next chunk
        if not outcome.stopped_by.startswith("run "):
            # Before the chunk is recorded as finished: a finished chunk always has its checkpoint.
            checkpoints = run_checkpoints(run, chunk.cluster)  # its cluster's store, if it has one
            from storage.tensorblob import Meter  # lazily: imports torch

            written = Meter()
            checkpoints.write(index, generation, seq, learner, slot.extra(), meter=written)
            outcome.checkpoint_bytes = written.written
            checkpoints.prune(index, keep=2)
    except Exception as exc:
        logger.exception("learner %s g%s chunk %s failed", learner_id, generation, seq)
        if ranks is not None:
            ranks.abort()  # kill the helpers of the session under way
        else:
            learner_ranks_release(run_key(run), index)  # its kept group is not trusted after a failure
        _LEARNERS.pop((run_key(run), index), None)
        services.learner_chunk_finish(
            chunk_id=chunk.pk,
            outcome=outcome,
            wall_seconds=time.monotonic() - started,
            started_at=started_at,
            finished_at=timezone.now(),
            error=f"{type(exc).__name__}: {exc}",
        )
        return
    try:
        services.learner_chunk_finish(
            chunk_id=chunk.pk,
            outcome=outcome,
            wall_seconds=time.monotonic() - started,
            started_at=started_at,
            finished_at=timezone.now(),
        )
    except BaseException:
        _LEARNERS.pop((run_key(run), index), None)  # not finished: the cache is not chunk `seq`'s end
        raise
    slot.done = (generation, seq)
    if outcome.stopped_by.startswith("run ") or (  # or a budget reached, billed: the run ends
        outcome.stopped_by == services.BUDGET_REACHED and services.training_run_budget_reached(run, chunk.pk)
    ):
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
        down=engine.rc.compression_config().down_kind,
        # A fragment's state is read from its newest version for each merge and let go of
        # after: the control worker holds one fragment, not every running run's whole model 3×.
        offload=True,
    )
    _SYNCERS[run_key(run)] = syncer
    return syncer


def syncer_tick_execute(*, run_id: int, token: str) -> None:
    """One syncer tick (the `training.syncer_tick` task): merge, publish, record, maybe finish."""
    span_attributes(training_run_id=run_id)
    run = services.syncer_tick_claim(run_id=run_id, token=token)
    if run is None:
        return
    engine = run_engine(run)
    transport = run_transport(run)
    syncer = _syncer_for(run, engine, transport)
    now = time.time()
    syncer.pull(now)
    sizes = {d.id: d.nbytes for queued in syncer.pending for d in queued}
    try:
        published = syncer.poll(now)
    except BaseException:
        # A merge that failed part-way may have applied some tensors: the next tick resumes
        # from the store rather than trusting this syncer's state.
        _SYNCERS.pop(run_key(run), None)
        raise
    if published:
        logger.info("run %s: published %s", run_id, [(v.fragment, v.version) for v in published])
    # Record every stored version the database does not know yet: this tick's and any that an
    # earlier syncer published before it was killed (publishing and recording are not atomic).
    services.global_versions_record_missing(
        run=run,
        engine=engine,
        transport=transport,
        at_hand={(v.fragment, v.version): v for v in published},
        delta_bytes=sizes,
    )
    # Their eval losses come from an evaluator on a cluster's queue, not from this worker.
    services.versions_evaluate_send(run)
    services.model_versions_register_due(run=run, engine=engine, transport=transport)
    if published:
        services.run_store_sweep(run=run, engine=engine, transport=transport, syncer=syncer)
    run = services.training_run_check_stop(run=run)
    if run.is_finished:
        # Once more after the final export: the run page shows what the run left in the store.
        services.run_store_sweep(run=run, engine=engine, transport=transport, syncer=syncer)
        forget_run(run)
        return
    services.syncer_tick_continue(run_id=run_id, token=token)
