"""Learner checkpoints in the object store: a learner's state after each chunk.

A chunk of learner ``i`` (generation ``g``, chunk ``c``) ends by writing

    <prefix>/learners/l<i>/g<g>-c<c>.syd

a tensor blob (storage.tensorblob) of :meth:`Learner.state_dict`: parameters, anchors, the
held copy of the global version, AdamW moments and step counts, the lr schedule position,
pending steps and tokens, the push counter, error-feedback residuals, the sampler's generator,
plus whatever the caller adds (``extra``, JSON). Chunk ``c + 1`` starts from exactly that
checkpoint, in whatever process of the cluster picks it up. Checkpoints are streamed into and
out of the store tensor by tensor (storage.tensorblob.blob_write / blob_read): a checkpoint of a
large model is several times its size and never exists as one byte string.

Keys name the chunk that *wrote* them, so a chunk only ever reads a checkpoint written before
it started (``latest_before``): a chunk that is run again after a crash never sees the
checkpoint its first attempt may have left behind, and overwrites it when it finishes.

A checkpoint is about five times the model (parameters, anchors, held copy, two AdamW
moments), so only the newest few are kept (``prune``): the newest one is what the next chunk
starts from, the one before is what a re-run of the chunk that wrote the newest starts from.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from storage.objectstore import ObjectStore
from storage.tensorblob import Meter, blob_read, blob_write
from training.engine.learner import Learner

_KEY = re.compile(r"g(\d+)-c(\d+)\.syd$")


class CheckpointStore:
    """The learner checkpoints of one run (``prefix`` is the run's prefix in the store)."""

    def __init__(self, store: ObjectStore, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def _dir(self, learner: int) -> str:
        return f"{self.prefix}learners/l{learner:04d}/"

    def key(self, learner: int, generation: int, chunk: int) -> str:
        return f"{self._dir(learner)}g{generation:06d}-c{chunk:08d}.syd"

    def write(
        self,
        learner: int,
        generation: int,
        chunk: int,
        state: Learner,
        extra: dict[str, Any] | None = None,
        *,
        meter: Meter | None = None,
    ) -> str:
        """Stream learner ``state`` (and ``extra``) to the checkpoint of (generation, chunk); its key.
        ``meter`` counts the bytes the store took."""
        key = self.key(learner, generation, chunk)
        meta, tensors = state.state_dict()
        blob_write(self.store, key, {"learner": meta, "extra": extra or {}}, tensors, meter=meter)
        return key

    def read(
        self, learner: int, generation: int, chunk: int
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(meta, tensors) of a checkpoint, streamed: meta has ``learner`` and ``extra``."""
        return blob_read(self.store, self.key(learner, generation, chunk))

    def load(self, learner: int, generation: int, chunk: int, state: Learner) -> dict[str, Any]:
        """Restore ``state`` (same model and fragments) from a checkpoint; returns its ``extra``."""
        meta, tensors = self.read(learner, generation, chunk)
        state.load_state_dict(meta["learner"], tensors)
        return dict(meta["extra"])

    def list(self, learner: int) -> list[tuple[int, int]]:
        """(generation, chunk) of every checkpoint of a learner, oldest first."""
        found = []
        for key in self.store.list(self._dir(learner)):
            m = _KEY.search(key)
            if m:
                found.append((int(m.group(1)), int(m.group(2))))
        return sorted(found)

    def prune(self, learner: int, *, keep: int = 2) -> int:
        """Delete all but the ``keep`` newest checkpoints of a learner; returns how many went."""
        old = self.list(learner)[:-keep] if keep > 0 else self.list(learner)
        for gc in old:
            self.store.delete(self.key(learner, *gc))
        return len(old)

    def latest_before(self, learner: int, generation: int, chunk: int) -> tuple[int, int] | None:
        """The newest checkpoint written by a chunk before (generation, chunk), if any."""
        older = [gc for gc in self.list(learner) if gc < (generation, chunk)]
        return older[-1] if older else None
