"""Text datasets in the object store, streamed as token windows: sharded, deterministic, resumable.

A dataset is a list of objects (sorted keys under a prefix) in one format:

* ``text``: any file; it is cut into pieces of at most ``TEXT_PIECE_BYTES`` at line ends, and
  each piece is a document for sharding and hold-out (the end-of-sequence token follows only
  the file's last piece);
* ``jsonl``: one JSON object per line, its ``text_field`` (default ``text``) a string;
* ``parquet``: a string column named ``text_field``, read a row group at a time (pyarrow).

Document j of file i is held out for evaluation when crc32("<key>#<j>") % n == 0 (n =
``eval_every_nth``; 0 holds out nothing): a choice that depends on neither the sharding nor
the order in which files are read.

Training documents go to S = learners × ranks shards; shard s = learner · ranks + rank. The
files, in key order, are one sequence of bytes (rows for Parquet) cut into S ranges of about
equal size, each moved forward to the next document start (training.engine.shards.manifest):
whatever the number of files, a shard reads only its own range, the shards are disjoint and
cover every training document, and a shard's order is the same every time. A run records the
split once in its dataset manifest; every learner and rank reads that one. A shard that runs
out starts its next epoch in the same order.

Each shard's documents are tokenised, separated by the end-of-sequence id when there is one,
packed into one stream, and cut into windows of block_size + 1 tokens (inputs and the targets
shifted by one) that start block_size tokens apart. ``TokenStream.position()`` names the first
token of the next window as (epoch, document, offset) and where that document starts in its
file (file, at, index, line); a stream built with that position reads on from there and gives
the same windows the original would have given next. A position without the file part (saved
before it existed) is reached by reading the shard from its start.
"""

from __future__ import annotations

import json
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from storage.objectstore import ObjectStore
from training.engine.shards import (
    TEXT_PIECE_BYTES,
    Cursor,
    DatasetError,
    DatasetManifest,
    Document,
    Format,
    TextDataset,
    build_manifest,
    range_documents,
)
from training.engine.tokenizer import Tokenizer, TokenizerError

__all__ = [
    "FORMATS",
    "TEXT_PIECE_BYTES",
    "DatasetError",
    "DatasetManifest",
    "Document",
    "Format",
    "StreamPosition",
    "TextDataset",
    "TokenStream",
    "check_tokens_fit",
    "dataset_keys",
    "documents",
    "eval_batches",
    "held_out",
    "shard_documents",
    "shard_manifest",
]

FORMATS: tuple[Format, ...] = ("text", "jsonl", "parquet")
_SUFFIXES: dict[Format, tuple[str, ...]] = {
    "text": (),
    "jsonl": (".jsonl", ".ndjson"),
    "parquet": (".parquet",),
}


def dataset_keys(store: ObjectStore, prefix: str, fmt: Format) -> tuple[str, ...]:
    """The object at ``prefix`` itself, or every object under ``prefix/`` of the format, sorted."""
    prefix = prefix.strip("/")
    if prefix and store.exists(prefix):
        return (prefix,)
    under = f"{prefix}/" if prefix else ""
    suffixes = _SUFFIXES[fmt]
    keys = [
        k
        for k in store.list(under)
        if not k.rsplit("/", 1)[-1].startswith(".") and (not suffixes or k.endswith(suffixes))
    ]
    if not keys:
        raise DatasetError(f"no {fmt} objects under {prefix or 'the store root'!r}")
    return tuple(sorted(keys))


def held_out(key: str, index: int, every_nth: int) -> bool:
    return every_nth > 0 and zlib.crc32(f"{key}#{index}".encode()) % every_nth == 0


def documents(store: ObjectStore, dataset: TextDataset) -> Iterator[Document]:
    """Every document of the dataset, held out or not, in file order."""
    return range_documents(store, dataset, start=Cursor(), stop=Cursor(len(dataset.keys)))


def _is_held_out(doc: Document, dataset: TextDataset) -> bool:
    return held_out(dataset.keys[doc.file], doc.index, dataset.eval_every_nth)


def shard_manifest(
    store: ObjectStore, dataset: TextDataset, *, shards: int, manifest: DatasetManifest | None = None
) -> DatasetManifest:
    """``manifest`` checked against the dataset; without one, the whole dataset for one shard
    or a split built here (a run passes the one it stored, so that it is built only once)."""
    if manifest is None:
        if shards == 1:
            return DatasetManifest.whole(dataset)
        return build_manifest(store, dataset, shards=shards)
    manifest.check(dataset, shards=shards)
    return manifest


def shard_documents(
    store: ObjectStore,
    dataset: TextDataset,
    *,
    shard: int,
    shards: int,
    manifest: DatasetManifest | None = None,
    start: Cursor | None = None,
) -> Iterator[Document]:
    """One shard's training documents, in order (one epoch, or its rest from ``start``, a
    document start inside the shard); see the module docstring."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards}")
    split = shard_manifest(store, dataset, shards=shards, manifest=manifest)
    docs = range_documents(store, dataset, start=start or split.starts[shard], stop=split.starts[shard + 1])
    return (doc for doc in docs if not _is_held_out(doc, dataset))


def _tokens(doc: Document, tokenizer: Tokenizer) -> list[int]:
    ids = tokenizer.encode(doc.text)
    if doc.ends_source and tokenizer.eos_id is not None:
        ids.append(tokenizer.eos_id)
    return ids


# --- Windows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamPosition:
    """The first token of the next window: document ``document`` (counted within the shard's
    epoch ``epoch``), token ``offset`` of it; that document starts at ``Cursor(file, at, index,
    line)`` (``file`` -1: not known, the document is found by counting from the shard's start)."""

    epoch: int = 0
    document: int = 0
    offset: int = 0
    file: int = -1
    at: int = 0
    index: int = 0
    line: int = 1

    def as_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "document": self.document,
            "offset": self.offset,
            "file": self.file,
            "at": self.at,
            "index": self.index,
            "line": self.line,
        }

    def cursor(self) -> Cursor | None:
        return Cursor(self.file, self.at, self.index, self.line) if self.file >= 0 else None


class TokenStream:
    """(x, y) batches of packed token windows from one shard; a BatchSampler for text datasets.

    ``manifest`` is the dataset's split into ``shards`` shards (a run's, read from its store);
    without one it is built here.
    """

    def __init__(
        self,
        store: ObjectStore,
        dataset: TextDataset,
        tokenizer: Tokenizer,
        *,
        block_size: int,
        batch_size: int,
        shard: int = 0,
        shards: int = 1,
        position: StreamPosition | None = None,
        manifest: DatasetManifest | None = None,
    ) -> None:
        self.store, self.dataset, self.tokenizer = store, dataset, tokenizer
        self.block_size, self.batch_size = block_size, batch_size
        self.shard, self.shards = shard, shards
        self.manifest = shard_manifest(store, dataset, shards=shards, manifest=manifest)
        start = position or StreamPosition()
        self._docs = self._numbered(start)
        self._buf: list[int] = []
        # One entry per document with tokens in the buffer: [epoch, document, offset of its first
        # buffered token, tokens of it still buffered, file, at, index, line (where it starts)].
        self._segs: deque[list[int]] = deque()
        self._next = start  # where reading resumes once the buffer is empty

    def _numbered(self, start: StreamPosition) -> Iterator[tuple[int, int, Document, list[int]]]:
        epoch, offset = start.epoch, start.offset
        resume = start.cursor()
        # With the document's place in its file, reading starts there; without it (a position
        # saved before positions had one), the shard is read from its start and counted.
        n, skip = (start.document, 0) if resume is not None else (0, start.document)
        while True:
            docs = shard_documents(
                self.store,
                self.dataset,
                shard=self.shard,
                shards=self.shards,
                manifest=self.manifest,
                start=resume,
            )
            tokens, from_start = 0, resume is None and not skip
            for doc in docs:
                if skip:
                    n, skip = n + 1, skip - 1
                    continue
                ids = _tokens(doc, self.tokenizer)
                if offset:
                    ids, offset = ids[offset:], 0
                tokens += len(ids)
                yield epoch, n, doc, ids
                n += 1
            if not tokens and from_start:
                raise DatasetError(f"shard {self.shard} of {self.shards} has no training text")
            epoch, n, skip, resume = epoch + 1, 0, 0, None

    def _fill(self, need: int) -> None:
        while len(self._buf) < need:
            epoch, n, doc, ids = next(self._docs)
            first = self._next.offset if (epoch, n) == (self._next.epoch, self._next.document) else 0
            after = doc.after()
            self._next = StreamPosition(epoch, n + 1, 0, after.file, after.at, after.index, after.line)
            if ids:
                self._segs.append([epoch, n, first, len(ids), doc.file, doc.at, doc.index, doc.line])
                self._buf.extend(ids)

    def _consume(self, count: int) -> None:
        del self._buf[:count]
        while count > 0:
            seg = self._segs[0]
            if seg[3] <= count:
                count -= seg[3]
                self._segs.popleft()
            else:
                seg[2] += count
                seg[3] -= count
                count = 0

    def position(self) -> StreamPosition:
        if self._segs:
            epoch, n, offset, _, file, at, index, line = self._segs[0]
            return StreamPosition(epoch, n, offset, file, at, index, line)
        return self._next

    def window(self) -> list[int]:
        t = self.block_size
        self._fill(t + 1)
        out = self._buf[: t + 1]
        self._consume(t)
        return out

    def get_state(self) -> list[int]:
        """The stream's position as bytes, saved in a learner checkpoint (training.engine.learner)."""
        return list(json.dumps(self.position().as_dict(), sort_keys=True).encode())

    def set_state(self, state: torch.Tensor) -> None:
        """Continue from a position get_state saved: the next window starts where it did then."""
        pos = StreamPosition(**json.loads(bytes(state.to(torch.uint8).tolist())))
        self._docs = self._numbered(pos)
        self._buf, self._segs, self._next = [], deque(), pos

    def skip(self, windows: int) -> None:
        """Move past ``windows`` windows without building them (a learner that resumes mid-shard)."""
        t = self.block_size
        for _ in range(windows):
            self._fill(t + 1)
            self._consume(t)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        win = torch.tensor([self.window() for _ in range(self.batch_size)], dtype=torch.long)
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()


def eval_batches(
    store: ObjectStore,
    dataset: TextDataset,
    tokenizer: Tokenizer,
    *,
    block_size: int,
    windows: int,
    batch_size: int = 64,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``windows`` windows of the held-out documents, in file order (reads no further)."""
    buf: list[int] = []
    wins: list[list[int]] = []
    for doc in documents(store, dataset):
        if not _is_held_out(doc, dataset):
            continue
        buf.extend(_tokens(doc, tokenizer))
        while len(buf) > block_size and len(wins) < windows:
            wins.append(buf[: block_size + 1])
            del buf[:block_size]
        if len(wins) >= windows:
            break
    if not wins:
        raise DatasetError(
            "no held-out text for evaluation: the dataset is too small for eval_every_nth="
            f"{dataset.eval_every_nth} at block_size={block_size}"
        )
    out = []
    for i in range(0, len(wins), batch_size):
        t = torch.tensor(wins[i : i + batch_size], dtype=torch.long)
        out.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))
    return out


def check_tokens_fit(tokenizer: Tokenizer, vocab_size: int) -> None:
    """TokenizerError unless every id the tokenizer can produce is a row of the model's embedding."""
    if tokenizer.vocab_size > vocab_size:
        raise TokenizerError(
            f"the tokenizer has {tokenizer.vocab_size} tokens; the model's vocab_size is {vocab_size}"
        )
