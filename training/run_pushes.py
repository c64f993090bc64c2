"""A learner chunk's pushes: the slot that keeps a learner's push bookkeeping between chunks,
pushing a fragment's delta, the push of every pending fragment before a spot reclaim, and the
reconciling of pushes a dead chunk made after the checkpoint its learner restores
(training.orchestrator runs the chunk)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from training import services
from training.services import ChunkOutcome

if TYPE_CHECKING:
    from training.engine.learner import Learner
    from training.engine.transport import ObjectStoreTransport


@dataclass
class LearnerSlot:
    """A learner and its push bookkeeping. A fragment that falls due while its previous delta
    still waits for the syncer (no newer version adopted since) is *owed*, not pushed: its steps
    go in the next delta, sent once a newer version arrives. Two fresh deltas of one learner on
    one version would be averaged by the syncer's token-weighted mean, not added: half lost."""

    learner: Learner
    pushed_base: dict[int, int] = field(default_factory=dict)  # fragment -> base version of the last push
    owed: set[int] = field(default_factory=set)
    done: tuple[int, int] | None = None  # (generation, chunk) whose end state this is

    def may_push(self, fragment: int) -> bool:
        """No delta of the fragment waits with the syncer (a newer version was adopted since)."""
        return (
            fragment not in self.pushed_base
            or self.learner.base_version[fragment] > self.pushed_base[fragment]
        )

    def extra(self) -> dict[str, object]:
        """The slot's own state, saved with the learner's checkpoint."""
        return {"pushed_base": {str(f): v for f, v in self.pushed_base.items()}, "owed": sorted(self.owed)}


def push_before_interruption(
    slot: LearnerSlot,
    transport: ObjectStoreTransport,
    outcome: ChunkOutcome,
    chunk_id: int,
    learner_id: int,
    tokens_total: int,
) -> None:
    """The cluster is being reclaimed: push every fragment's pending steps now, not at its next
    due step. A fragment whose previous delta is still with the syncer is not pushed again
    (LearnerSlot says why): its steps stay in this chunk's checkpoint, which the re-placed
    learner restores. Every token trained reaches the store (the supervisor's tokens_lost: 0).
    """
    learner = slot.learner
    for f in range(len(learner.fragments)):
        if learner.pending_tokens[f] > 0 and slot.may_push(f):
            push(slot, transport, outcome, f)
    pushes_record(chunk_id, learner_id, outcome, tokens_total)


def pushes_record(chunk_id: int, learner_id: int, outcome: ChunkOutcome, tokens_total: int) -> None:
    """Record how far the chunk got at a push (a chunk killed later leaves this behind)."""
    services.learner_chunk_progress(
        chunk_id=chunk_id,
        learner_id=learner_id,
        steps=outcome.steps,
        tokens=outcome.tokens,
        deltas_pushed=outcome.deltas_pushed,
        bytes_sent=outcome.bytes_sent,
        bytes_received=outcome.bytes_received,
        tokens_at_push=tokens_total,
    )


def push(slot: LearnerSlot, transport: ObjectStoreTransport, outcome: ChunkOutcome, fragment: int) -> None:
    """Push a fragment's delta; the bytes sent are measured (the blob the store took)."""
    slot.owed.discard(fragment)
    slot.pushed_base[fragment] = slot.learner.base_version[fragment]
    sent = slot.learner.make_delta(fragment, now=time.time())
    before = transport.bytes_up
    transport.put_delta(sent)
    outcome.deltas_pushed += 1
    outcome.bytes_sent += transport.bytes_up - before


def reconcile_pushes(
    slot: LearnerSlot, transport: ObjectStoreTransport, index: int, first_seq: int, *, rejoined: bool
) -> None:
    """Account for pushes made after the learner's state was saved, by a chunk that then died
    (this chunk's earlier attempt, or, for a re-placed learner, its old generation's last chunk):
    delta ids number a learner's pushes in increasing order, so every delta of this learner with
    a number at or past the restored push counter (this chunk's first, for a rejoined learner,
    which restored none) was pushed after the checkpoint. Such a
    push already carried the fragment's pending steps: they are forgotten here (the anchor
    moves to θ_local) instead of being sent twice, and the windows the dead chunk trained up to
    its newest push are skipped, not trained again (Learner.skip_windows says why). Pushes are
    numbered past the dead chunk's, so none is mistaken for one already consumed.
    """
    learner = slot.learner
    since = first_seq if rejoined else learner.seq
    learner.seq = max(learner.seq, first_seq)
    for f in range(len(learner.fragments)):
        later = sorted(
            (int(i.rsplit("-s", 1)[1]), i)
            for i in transport.delta_ids(f, learner=index)
            if int(i.rsplit("-s", 1)[1]) >= since
        )
        if not later:
            continue
        learner.forget_pending(f)
        slot.owed.discard(f)
        newest_seq, newest_id = later[-1]
        newest = transport.get_delta(f, newest_id)
        slot.pushed_base[f] = newest.base_version
        learner.seq = max(learner.seq, newest_seq + 1)
        if newest.windows > learner.windows:
            learner.skip_windows(newest.windows - learner.windows)
