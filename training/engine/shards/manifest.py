"""A dataset's split into S shards by position, whatever its number of objects.

The objects, in key order, make one sequence of positions (bytes for text and JSONL, rows for
Parquet) of total size T. Shard s starts at the first document that begins at or after
position T·s/S: for JSONL the first line after the newline at or after the cut, for text the
next piece, for Parquet the next row with text. So no document is split or read twice, and
the shards, read from their start up to the next shard's start, are disjoint and cover every
document once; each shard reads only its own range of bytes.

The manifest records the objects' sizes and these S + 1 starts (each with the count of
documents before it in its object, for the hold-out rule). Finding them reads the dataset:
once for the sizes (the store has no size query here), again up to each cut. A run builds it
once, stores it beside its other objects (``run_manifest``), and every learner and rank reads
that one, so all of them use the same split.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from storage.objectstore import ObjectStore
from training.engine.shards.records import (
    Cursor,
    DatasetError,
    Document,
    TextDataset,
    file_documents,
    object_size,
)

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class DatasetManifest:
    """Shard s of ``shards`` reads the documents from ``starts[s]`` up to ``starts[s + 1]``."""

    keys: tuple[str, ...]
    format: str
    text_field: str
    shards: int
    sizes: tuple[int, ...]  # bytes (text, jsonl) or rows (parquet) per object; () if not measured
    starts: tuple[Cursor, ...]  # shards + 1 of them; the last is the dataset's end

    @classmethod
    def whole(cls, dataset: TextDataset) -> DatasetManifest:
        """One shard: the whole dataset (no sizes needed)."""
        return cls(
            keys=dataset.keys,
            format=dataset.format,
            text_field=dataset.text_field,
            shards=1,
            sizes=(),
            starts=(Cursor(), Cursor(len(dataset.keys))),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "keys": list(self.keys),
            "format": self.format,
            "text_field": self.text_field,
            "shards": self.shards,
            "sizes": list(self.sizes),
            "starts": [c.as_dict() for c in self.starts],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DatasetManifest:
        if raw.get("version") != MANIFEST_VERSION:
            raise DatasetError(f"dataset manifest version {raw.get('version')!r} is not {MANIFEST_VERSION}")
        return cls(
            keys=tuple(raw["keys"]),
            format=raw["format"],
            text_field=raw["text_field"],
            shards=int(raw["shards"]),
            sizes=tuple(int(n) for n in raw["sizes"]),
            starts=tuple(Cursor(**c) for c in raw["starts"]),
        )

    def to_json(self) -> bytes:
        return json.dumps(self.as_dict(), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> DatasetManifest:
        return cls.from_dict(json.loads(data))

    def check(self, dataset: TextDataset, *, shards: int) -> None:
        """DatasetError unless this manifest splits ``dataset`` into ``shards`` shards."""
        want = (dataset.keys, dataset.format, dataset.text_field, shards)
        have = (self.keys, self.format, self.text_field, self.shards)
        if want != have:
            raise DatasetError(
                "the dataset's manifest does not match the dataset: it splits "
                f"{len(self.keys)} {self.format} objects ({self.text_field!r}) into {self.shards} shards, "
                f"the run reads {len(dataset.keys)} {dataset.format} objects ({dataset.text_field!r}) "
                f"in {shards} shards"
            )


def build_manifest(store: ObjectStore, dataset: TextDataset, *, shards: int) -> DatasetManifest:
    """Measure the dataset and find where each of ``shards`` shards starts (see the docstring)."""
    if shards < 1:
        raise ValueError(f"{shards} shards")
    sizes = tuple(object_size(store, key, dataset.format) for key in dataset.keys)
    total = sum(sizes)
    cuts = [total * s // shards for s in range(1, shards)]
    starts = [Cursor()]
    first = 0  # position of object i's first byte or row in the whole sequence
    for i, size in enumerate(sizes):
        inside = [c - first for c in cuts if first <= c < first + size]
        starts.extend(_aligned(store, dataset, i, inside))
        first += size
    starts.append(Cursor(len(dataset.keys)))
    return DatasetManifest(
        keys=dataset.keys,
        format=dataset.format,
        text_field=dataset.text_field,
        shards=shards,
        sizes=sizes,
        starts=tuple(starts),
    )


def _aligned(store: ObjectStore, dataset: TextDataset, file: int, offsets: list[int]) -> list[Cursor]:
    """For each offset (ascending) in object ``file``, the first document starting at or after
    it; the next object's start when none does. Reads the object once, up to the last one."""
    out: list[Cursor] = []
    left = list(offsets)
    if not left:
        return out
    docs = file_documents(store, dataset, start=Cursor(file))
    try:
        for doc in docs:
            while left and doc.at >= left[0]:
                out.append(Cursor(file, doc.at, doc.index, doc.line))
                left.pop(0)
            if not left:
                break
    finally:
        docs.close()  # stop reading the object here
    out.extend(Cursor(file + 1) for _ in left)
    return out


def range_documents(
    store: ObjectStore, dataset: TextDataset, *, start: Cursor, stop: Cursor
) -> Iterator[Document]:
    """Every document (held out or not) from ``start`` up to ``stop``, in order."""
    for i in range(start.file, min(stop.file, len(dataset.keys) - 1) + 1):
        if i == stop.file and stop.at == 0:
            break
        begin = start if i == start.file else Cursor(i)
        yield from file_documents(store, dataset, start=begin, stop=stop.at if i == stop.file else None)


def run_manifest(
    run_store: ObjectStore, key: str, data_store: ObjectStore, dataset: TextDataset, *, shards: int
) -> DatasetManifest:
    """The run's manifest at ``key`` of its store: read if there, else built and stored.

    Written with ``put_if_absent``: of two processes that build it at the same time, the first
    write wins and the other reads that one, so every learner splits the data the same way.
    """
    if not run_store.exists(key):
        built = build_manifest(data_store, dataset, shards=shards)
        if run_store.put_if_absent(key, built.to_json()):
            return built
    stored = DatasetManifest.from_json(run_store.get(key))
    stored.check(dataset, shards=shards)
    return stored
