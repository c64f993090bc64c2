"""The documents of one dataset object, read from any document start to any stop.

A position in an object is a byte for ``text`` and ``jsonl`` and a row for ``parquet``. A
:class:`Cursor` names the start of a document there (with the count of documents before it,
which the hold-out rule needs, and for JSONL the line number, which error messages need), so a
reader can begin mid-object and give exactly the documents a reader from the object's start
would have given from that point on:

* ``text``: pieces of at most ``TEXT_PIECE_BYTES``, cut after the last newline within that many
  bytes (or at a UTF-8 character boundary). A piece's cut depends only on the bytes from its
  start, so pieces read from a piece start are the pieces read from the object's start;
* ``jsonl``: one document per non-blank line (a line start is the byte after a newline);
* ``parquet``: one document per non-null value of the text column, row groups read as needed
  (the object is fetched whole: Parquet keeps its schema at the end).
"""

from __future__ import annotations

import io
import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from storage.objectstore import ObjectStore

Format = Literal["text", "jsonl", "parquet"]
TEXT_PIECE_BYTES = 1 << 16


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
class Cursor:
    """The start of a document: object ``file``, byte or row ``at``; ``index`` documents of that
    object come before it and it starts on line ``line`` (JSONL). ``file`` = the number of
    objects is the end of the dataset."""

    file: int = 0
    at: int = 0
    index: int = 0
    line: int = 1

    def as_dict(self) -> dict[str, int]:
        return {"file": self.file, "at": self.at, "index": self.index, "line": self.line}


@dataclass(frozen=True)
class Document:
    file: int  # index into TextDataset.keys
    index: int  # position within its file
    text: str
    ends_source: bool = True  # False for a text piece that is not its file's last
    at: int = 0  # its first byte (text, jsonl) or its row (parquet) in the file
    end: int = 0  # the byte or row after it
    line: int = 1  # its line (jsonl)

    def after(self) -> Cursor:
        """Where reading continues after this document."""
        return Cursor(self.file, self.end, self.index + 1, self.line + 1)


def byte_range(store: ObjectStore, key: str, start: int, stop: int | None) -> Iterator[bytes]:
    """Bytes ``start`` up to ``stop`` (the end when None) of an object, in blocks.

    The store's streamed read is used from the object's start, skipping what comes before
    ``start``, and closed at ``stop``.
    """
    chunks = store.iter_chunks(key)
    pos = 0
    try:
        for chunk in chunks:
            lo, hi = pos, pos + len(chunk)
            pos = hi
            if hi <= start:
                continue
            if stop is not None and lo >= stop:
                break
            piece = chunk[max(0, start - lo) : len(chunk) if stop is None else min(len(chunk), stop - lo)]
            if piece:
                yield piece
            if stop is not None and hi >= stop:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # an S3 body is released now, not when the generator is collected


def object_size(store: ObjectStore, key: str, fmt: Format) -> int:
    """Bytes (text, jsonl) or rows (parquet) of an object."""
    if fmt == "parquet":
        return int(_parquet_file(store, key).metadata.num_rows)
    return sum(len(chunk) for chunk in store.iter_chunks(key))


def _pieces(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Pieces of at most TEXT_PIECE_BYTES, cut after a newline where there is one."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while len(pending) >= TEXT_PIECE_BYTES:
            cut = pending.rfind(b"\n", 0, TEXT_PIECE_BYTES) + 1 or TEXT_PIECE_BYTES
            # A cut inside a UTF-8 sequence would garble one character; move it back to a boundary.
            while cut < len(pending) and cut > 1 and (pending[cut] & 0xC0) == 0x80:
                cut -= 1
            yield pending[:cut]
            pending = pending[cut:]
    if pending:
        yield pending


def _lines(chunks: Iterator[bytes]) -> Iterator[tuple[bytes, int]]:
    """Each line without its newline, and the bytes it takes (with its newline)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line, len(line) + 1
    if pending:
        yield pending, len(pending)


def file_documents(
    store: ObjectStore, dataset: TextDataset, *, start: Cursor, stop: int | None = None
) -> Generator[Document, None, None]:
    """The documents of object ``start.file`` from ``start`` to ``stop`` (a document start, or
    None for the object's end), in order."""
    key, fmt, text_field = dataset.keys[start.file], dataset.format, dataset.text_field
    i, at, index, line = start.file, start.at, start.index, start.line
    if fmt == "text":
        previous: Document | None = None
        for piece in _pieces(byte_range(store, key, at, stop)):
            if previous is not None:
                yield previous
            text = piece.decode("utf-8", errors="replace")
            previous = Document(i, index, text, False, at, at + len(piece), line)
            at, index = at + len(piece), index + 1
        if previous is not None:
            # Only the object's last piece is followed by the end-of-sequence token.
            yield Document(i, previous.index, previous.text, stop is None, previous.at, previous.end, line)
    elif fmt == "jsonl":
        for raw, width in _lines(byte_range(store, key, at, stop)):
            if raw.strip():
                yield Document(i, index, _json_text(raw, key, line, text_field), True, at, at + width, line)
                index += 1
            at, line = at + width, line + 1
    else:
        yield from _parquet_documents(store, key, text_field, start, stop)


def _json_text(raw: bytes, key: str, line: int, field: str) -> str:
    try:
        row = json.loads(raw)
    except ValueError as exc:
        raise DatasetError(f"{key} line {line}: not JSON ({exc})") from exc
    text = row.get(field) if isinstance(row, dict) else None
    if not isinstance(text, str):
        raise DatasetError(f"{key} line {line}: no string field {field!r}")
    return text


def _parquet_file(store: ObjectStore, key: str) -> Any:
    import pyarrow.parquet as pq  # lazily: only Parquet datasets need pyarrow

    try:
        return pq.ParquetFile(io.BytesIO(store.get(key)))
    except Exception as exc:  # pyarrow's ArrowInvalid and friends
        raise DatasetError(f"{key}: not a Parquet file ({exc})") from exc


def _parquet_documents(
    store: ObjectStore, key: str, column: str, start: Cursor, stop: int | None
) -> Iterator[Document]:
    pf = _parquet_file(store, key)
    if column not in pf.schema_arrow.names:
        raise DatasetError(f"{key}: no column {column!r} (columns: {', '.join(pf.schema_arrow.names)})")
    index, first = start.index, 0
    for group in range(pf.metadata.num_row_groups):
        rows = pf.metadata.row_group(group).num_rows
        lo, hi = max(start.at, first), min(first + rows, pf.metadata.num_rows if stop is None else stop)
        if lo < hi:  # only the row groups the range touches are decoded
            for batch in pf.iter_batches(columns=[column], batch_size=1024, row_groups=[group]):
                values = batch.column(0).to_pylist()
                for row, value in enumerate(values, start=first):
                    if not lo <= row < hi or value is None:
                        continue
                    if not isinstance(value, str):
                        raise DatasetError(f"{key}: column {column!r} holds {type(value).__name__}, not text")
                    yield Document(start.file, index, value, True, row, row + 1, 1)
                    index += 1
                first += len(values)
        else:
            first += rows
