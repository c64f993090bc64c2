"""Text datasets in the object store, streamed as token windows: sharded, deterministic, resumable.

A dataset is a list of objects (sorted keys under a prefix) in one format:

* ``text``: any file; it is cut into pieces of at most ``TEXT_PIECE_BYTES`` at line ends, and
  each piece is a document for sharding and hold-out (the end-of-sequence token follows only
  the file's last piece);
* ``jsonl``: one JSON object per line, its ``text_field`` (default ``text``) a string;
* ``parquet``: a string column named ``text_field``, read a row batch at a time (pyarrow).

Document j of file i is held out for evaluation when crc32("<key>#<j>") % n == 0 (n =
``eval_every_nth``; 0 holds out nothing): a choice that depends on neither the sharding nor
the order in which files are read.

Training documents go to S = learners × ranks shards; shard s = learner · ranks + rank. When
the number of files is a multiple of S, file i goes whole to shard i mod S (a shard reads only
its own files); otherwise every shard reads every file and keeps training document k when
k mod S = s, k counting training documents in file order. Either way the shards are disjoint,
cover every training document, and a shard's order is the same every time. A shard that runs
out starts its next epoch in the same order.

Each shard's documents are tokenised, separated by the end-of-sequence id when there is one,
packed into one stream, and cut into windows of block_size + 1 tokens (inputs and the targets
shifted by one) that start block_size tokens apart. ``TokenStream.position()`` names the first
token of the next window as (epoch, document, offset); a stream built with that position gives
the same windows the original would have given next.
"""

from __future__ import annotations

import io
import json
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from storage.objectstore import ObjectStore
from training.engine.tokenizer import Tokenizer, TokenizerError

Format = Literal["text", "jsonl", "parquet"]
FORMATS: tuple[Format, ...] = ("text", "jsonl", "parquet")
TEXT_PIECE_BYTES = 1 << 16
_SUFFIXES: dict[Format, tuple[str, ...]] = {
    "text": (),
    "jsonl": (".jsonl", ".ndjson"),
    "parquet": (".parquet",),
}


class DatasetError(ValueError):
    """A dataset that cannot be read as declared (the message names the object and why)."""


@dataclass(frozen=True)
class TextDataset:
    """Which objects, in which format, and which documents are held out."""

    keys: tuple[str, ...]
    format: Format
    text_field: str = "text"
    eval_every_nth: int = 10


@dataclass(frozen=True)
class Document:
    file: int  # index into TextDataset.keys
    index: int  # position within its file
    text: str
    ends_source: bool = True  # False for a text piece that is not its file's last


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


# --- Reading one file -----------------------------------------------------------------------


def _text_pieces(chunks: Iterator[bytes]) -> Iterator[str]:
    """Pieces of at most TEXT_PIECE_BYTES, cut after a newline where there is one."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while len(pending) >= TEXT_PIECE_BYTES:
            cut = pending.rfind(b"\n", 0, TEXT_PIECE_BYTES) + 1 or TEXT_PIECE_BYTES
            # A cut inside a UTF-8 sequence would garble one character; move it back to a boundary.
            while cut < len(pending) and cut > 1 and (pending[cut] & 0xC0) == 0x80:
                cut -= 1
            yield pending[:cut].decode("utf-8", errors="replace")
            pending = pending[cut:]
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        yield from whole
    if pending:
        yield pending


def _file_texts(store: ObjectStore, key: str, dataset: TextDataset) -> Iterator[tuple[str, bool]]:
    """(text, ends its source document) for each document of one object, in order."""
    if dataset.format == "text":
        previous: str | None = None
        for piece in _text_pieces(store.iter_chunks(key)):
            if previous is not None:
                yield previous, False
            previous = piece
        if previous is not None:
            yield previous, True
    elif dataset.format == "jsonl":
        for n, line in enumerate(_lines(store.iter_chunks(key)), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DatasetError(f"{key} line {n}: not JSON ({exc})") from exc
            text = row.get(dataset.text_field) if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise DatasetError(f"{key} line {n}: no string field {dataset.text_field!r}")
            yield text, True
    else:
        yield from ((t, True) for t in _parquet_texts(store, key, dataset.text_field))


def _parquet_texts(store: ObjectStore, key: str, column: str) -> Iterator[str]:
    import pyarrow.parquet as pq  # lazily: only Parquet datasets need pyarrow

    try:
        # Parquet keeps its schema at the end of the file, so the object is read whole; the rows
        # are then decoded one batch at a time.
        pf = pq.ParquetFile(io.BytesIO(store.get(key)))
    except Exception as exc:  # pyarrow's ArrowInvalid and friends
        raise DatasetError(f"{key}: not a Parquet file ({exc})") from exc
    if column not in pf.schema_arrow.names:
        raise DatasetError(f"{key}: no column {column!r} (columns: {', '.join(pf.schema_arrow.names)})")
    for batch in pf.iter_batches(columns=[column], batch_size=1024):
        for value in batch.column(0).to_pylist():
            if value is None:
                continue
            if not isinstance(value, str):
                raise DatasetError(f"{key}: column {column!r} holds {type(value).__name__}, not text")
            yield value


def documents(store: ObjectStore, dataset: TextDataset) -> Iterator[Document]:
    """Every document of the dataset, held out or not, in file order."""
    for i, key in enumerate(dataset.keys):
        for j, (text, ends) in enumerate(_file_texts(store, key, dataset)):
            yield Document(file=i, index=j, text=text, ends_source=ends)


def _is_held_out(doc: Document, dataset: TextDataset) -> bool:
    return held_out(dataset.keys[doc.file], doc.index, dataset.eval_every_nth)


def shard_documents(
    store: ObjectStore, dataset: TextDataset, *, shard: int, shards: int
) -> Iterator[Document]:
    """One shard's training documents, in order (one epoch); see the module docstring."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} of {shards}")
    by_file = len(dataset.keys) % shards == 0
    k = 0
    for i, key in enumerate(dataset.keys):
        if by_file and i % shards != shard:
            continue
        for j, (text, ends) in enumerate(_file_texts(store, key, dataset)):
            if held_out(key, j, dataset.eval_every_nth):
                continue
            if by_file or k % shards == shard:
                yield Document(file=i, index=j, text=text, ends_source=ends)
            k += 1


def _tokens(doc: Document, tokenizer: Tokenizer) -> list[int]:
    ids = tokenizer.encode(doc.text)
    if doc.ends_source and tokenizer.eos_id is not None:
        ids.append(tokenizer.eos_id)
    return ids


# --- Windows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamPosition:
    """The first token of the next window: document ``document`` (counted within the shard's
    epoch ``epoch``), token ``offset`` of it."""

    epoch: int = 0
    document: int = 0
    offset: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "document": self.document, "offset": self.offset}


class TokenStream:
    """(x, y) batches of packed token windows from one shard; a BatchSampler for text datasets."""

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
    ) -> None:
        self.store, self.dataset, self.tokenizer = store, dataset, tokenizer
        self.block_size, self.batch_size = block_size, batch_size
        self.shard, self.shards = shard, shards
        start = position or StreamPosition()
        self._docs = self._numbered(start)
        self._buf: list[int] = []
        # One entry per document with tokens in the buffer: [epoch, document, offset of its first
        # buffered token, tokens of it still buffered].
        self._segs: deque[list[int]] = deque()
        self._next = start  # where reading resumes once the buffer is empty

    def _numbered(self, start: StreamPosition) -> Iterator[tuple[int, int, list[int]]]:
        epoch = start.epoch
        skip, offset = start.document, start.offset
        while True:
            docs = shard_documents(self.store, self.dataset, shard=self.shard, shards=self.shards)
            tokens = 0
            for n, doc in enumerate(docs):
                if n < skip:
                    continue
                ids = _tokens(doc, self.tokenizer)
                if offset:
                    ids, offset = ids[offset:], 0
                tokens += len(ids)
                yield epoch, n, ids
            if not tokens and not skip:
                raise DatasetError(f"shard {self.shard} of {self.shards} has no training text")
            epoch, skip = epoch + 1, 0

    def _fill(self, need: int) -> None:
        while len(self._buf) < need:
            epoch, n, ids = next(self._docs)
            first = self._next.offset if (epoch, n) == (self._next.epoch, self._next.document) else 0
            self._next = StreamPosition(epoch, n + 1, 0)
            if ids:
                self._segs.append([epoch, n, first, len(ids)])
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
            epoch, n, offset, _ = self._segs[0]
            return StreamPosition(epoch, n, offset)
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
