"""A text dataset split into learners x ranks shards by bytes (rows for Parquet), whatever its
number of objects; positions that resume a shard where it stopped; the run's manifest built once."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
import torch

from storage.objectstore import FileStore, open_store
from tests.training.engine.tiny_open_weights import parquet, sentences
from training.engine.shards import (
    Cursor,
    DatasetError,
    DatasetManifest,
    TextDataset,
    build_manifest,
    range_documents,
    run_manifest,
)
from training.engine.stream import StreamPosition, TokenStream, documents, held_out, shard_documents
from training.engine.tokenizer import ByteTokenizer

LEARNERS, RANKS = 2, 2
SHARDS = LEARNERS * RANKS


class CountingStore(FileStore):
    """A file store that counts the objects it opens and the bytes it hands out."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.opened: list[str] = []
        self.bytes_read = 0

    def iter_chunks(self, key: str, block: int = 1 << 16) -> Iterator[bytes]:
        self.opened.append(key)
        for chunk in super().iter_chunks(key, block=4093):  # small blocks: cuts fall inside them
            self.bytes_read += len(chunk)
            yield chunk

    def get(self, key: str) -> bytes:
        self.opened.append(key)
        return super().get(key)


def _records(count: int) -> list[bytes]:
    """JSONL lines of uneven length (a blank line among them), so cuts land inside records."""
    rng = random.Random(count)
    lines = [
        json.dumps({"text": " ".join(sentences(rng.randint(1, 6), seed=i)), "id": i}).encode()
        for i in range(count)
    ]
    lines.insert(count // 2, b"   ")
    return lines


def _dataset(store, fmt: str, files: int) -> TextDataset:
    if fmt == "jsonl":
        lines = _records(60)
        per = -(-len(lines) // files)
        for i in range(files):
            store.put(f"d/part-{i}.jsonl", b"".join(line + b"\n" for line in lines[i * per : (i + 1) * per]))
    else:
        for i in range(files):
            # About 0.5 to 1 MiB: 8 to 16 pieces of at most 64 KiB each.
            line = f"line {i}: {' '.join(sentences(3, seed=i))} — é\n"
            body = line * ((1 << 19) * (2 + i) // 2 // len(line.encode()))
            store.put(f"d/part-{i}.txt", body.encode())
    keys = tuple(sorted(store.list("d/")))
    return TextDataset(keys=keys, format=fmt, eval_every_nth=7)  # type: ignore[arg-type]


def _shard(store, ds, manifest, s):
    return list(range_documents(store, ds, start=manifest.starts[s], stop=manifest.starts[s + 1]))


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
@pytest.mark.parametrize("files", [1, 2, 3])
def test_four_shards_read_disjoint_ranges_that_cover_every_byte_and_record_once(tmp_path, fmt, files):
    store = CountingStore(tmp_path / "data")
    ds = _dataset(store, fmt, files)
    manifest = build_manifest(store, ds, shards=SHARDS)
    assert manifest.sizes == tuple(len(store.get(k)) for k in ds.keys)
    assert len(manifest.starts) == SHARDS + 1 and manifest.starts[-1] == Cursor(files)
    everything = list(documents(store, ds))
    shards = [_shard(store, ds, manifest, s) for s in range(SHARDS)]
    assert all(shards), "every shard gets documents"
    # Disjoint and complete: the shards, one after another, are the dataset's documents.
    assert [d for shard in shards for d in shard] == everything
    # ... and so every byte of every object exactly once, none split: each object is the
    # concatenation of the ranges the shards read of it.
    for i, key in enumerate(ds.keys):
        spans = sorted((d.at, d.end) for shard in shards for d in shard if d.file == i)
        covered = b"".join(store.get(key)[a:b] for a, b in spans)
        if fmt == "text":
            assert covered == store.get(key)
            assert "".join(d.text for d in everything if d.file == i).encode() == store.get(key)
        else:
            assert covered == store.get(key).replace(b"   \n", b"")  # all but the blank line
    # Whatever the number of files, the ranges are equal in bytes up to where their ends moved
    # to a document start: less than a document each (a text piece is up to 64 KiB).
    widths = [sum(d.end - d.at for d in shard) for shard in shards]
    assert max(widths) - min(widths) < 2 * max(d.end - d.at for d in everything)
    # Training documents (held-out ones aside) of the four shards, through shard_documents.
    training = [
        (d.file, d.index)
        for s in range(SHARDS)
        for d in shard_documents(store, ds, shard=s, shards=SHARDS, manifest=manifest)
    ]
    expected = [(d.file, d.index) for d in everything if not held_out(ds.keys[d.file], d.index, 7)]
    assert training == expected and len(set(training)) == len(training)


def test_a_shard_reads_no_object_outside_its_range(tmp_path):
    store = CountingStore(tmp_path / "data")
    ds = _dataset(store, "jsonl", 3)
    manifest = build_manifest(store, ds, shards=SHARDS)
    store.opened.clear()
    docs = _shard(store, ds, manifest, SHARDS - 1)
    assert set(store.opened) == {ds.keys[d.file] for d in docs} and ds.keys[0] not in store.opened


def test_parquet_shards_by_rows_across_row_groups(tmp_path):
    store = open_store(f"file://{tmp_path / 'data'}")
    docs = sentences(70, seed=3)
    store.put("p/a.parquet", parquet(docs[:45], row_group_size=8))
    store.put("p/b.parquet", parquet(docs[45:], row_group_size=8))
    ds = TextDataset(keys=("p/a.parquet", "p/b.parquet"), format="parquet", eval_every_nth=5)
    manifest = build_manifest(store, ds, shards=SHARDS)
    assert manifest.sizes == (45, 25)
    shards = [_shard(store, ds, manifest, s) for s in range(SHARDS)]
    assert [len(s) for s in shards] == [17, 18, 17, 18]  # from rows 0, 17, 35, 52 (b's row 7)
    assert [d.text for s in shards for d in s] == docs
    assert manifest.starts[3] == Cursor(1, 7, 7, 1)


def test_one_file_with_fewer_records_than_shards_leaves_a_shard_without_text(tmp_path):
    store = open_store(f"file://{tmp_path / 'data'}")
    store.put("d.jsonl", b'{"text": "one"}\n{"text": "two"}\n')
    ds = TextDataset(keys=("d.jsonl",), format="jsonl", eval_every_nth=0)
    manifest = build_manifest(store, ds, shards=SHARDS)
    assert [len(_shard(store, ds, manifest, s)) for s in range(SHARDS)] == [1, 0, 1, 0]
    empty = TokenStream(store, ds, ByteTokenizer(), block_size=4, batch_size=1, shard=1, shards=SHARDS)
    with pytest.raises(DatasetError, match="shard 1 of 4 has no training text"):
        empty.next()


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_a_shard_resumed_from_its_saved_position_reads_on_from_there(tmp_path, fmt):
    store = CountingStore(tmp_path / "data")
    ds = _dataset(store, fmt, 3)
    manifest = build_manifest(store, ds, shards=SHARDS)

    def stream(position=None):
        return TokenStream(
            store, ds, ByteTokenizer(), block_size=40 if fmt == "jsonl" else 4000, batch_size=2, shard=2, shards=SHARDS,
            manifest=manifest, position=position,
        )  # fmt: skip

    first = stream()
    for _ in range(25):
        first.next()
    saved = torch.as_tensor(first.get_state(), dtype=torch.uint8)
    where = first.position()
    assert where.file >= 0 and (where.at > 0 or where.file > manifest.starts[2].file)
    store.opened.clear()
    resumed = stream()
    resumed.set_state(saved)
    assert resumed.position() == where
    # A position saved before positions named their file is found by counting from the start.
    legacy = stream(StreamPosition(where.epoch, where.document, where.offset))
    for _ in range(60):  # on past the shard's end: the next epoch starts over in the same order
        a, b, c = first.next(), resumed.next(), legacy.next()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[0], c[0])
    assert first.position().epoch >= 1 and first.position() == resumed.position() == legacy.position()
    # The resumed stream opened the object it stopped in, not the ones of its range before it.
    assert store.opened[0] == ds.keys[where.file]


def test_the_manifest_is_built_once_and_read_by_every_later_learner(tmp_path, monkeypatch):
    data = CountingStore(tmp_path / "data")
    ds = _dataset(data, "jsonl", 3)
    runs = open_store(f"file://{tmp_path / 'runs'}")
    key = "runs/7/dataset/manifest.json"
    first = run_manifest(runs, key, data, ds, shards=SHARDS)
    assert DatasetManifest.from_json(runs.get(key)) == first and data.bytes_read > 0
    read_before = data.bytes_read
    second = run_manifest(runs, key, data, ds, shards=SHARDS)
    assert second == first and data.bytes_read == read_before  # read, not rebuilt
    # A learner that lost the race to store it uses the stored one, not its own.
    other = "runs/8/dataset/manifest.json"
    runs.put(other, build_manifest(data, ds, shards=SHARDS).to_json())
    monkeypatch.setattr(runs, "exists", lambda k: False)
    assert run_manifest(runs, other, data, ds, shards=SHARDS) == DatasetManifest.from_json(runs.get(other))
    monkeypatch.undo()
    # A run whose dataset or shard count no longer matches its manifest says so.
    with pytest.raises(DatasetError, match="into 4 shards.* in 6 shards"):
        run_manifest(runs, key, data, ds, shards=6)
    with pytest.raises(DatasetError, match="does not match"):
        run_manifest(runs, key, data, TextDataset(keys=ds.keys[:2], format="jsonl"), shards=SHARDS)
    # The manifest travels in a rank's sampler recipe as JSON and comes back equal.
    assert DatasetManifest.from_dict(json.loads(json.dumps(first.as_dict()))) == first
