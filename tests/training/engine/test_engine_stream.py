"""Text datasets streamed from the object store: sharded, deterministic, resumable, three formats."""

from __future__ import annotations

import json

import boto3
import pytest
import torch

from storage.objectstore import open_store
from tests.training.engine.tiny_open_weights import jsonl, parquet, sentences, tiny_tokenizer_json
from training.engine.stream import (
    TEXT_PIECE_BYTES,
    DatasetError,
    StreamPosition,
    TextDataset,
    TokenStream,
    dataset_keys,
    documents,
    eval_batches,
    held_out,
    shard_documents,
)
from training.engine.tokenizer import ByteTokenizer, JsonTokenizer, TokenizerError

DOCS = sentences(90, seed=1)


@pytest.fixture(scope="module")
def tokenizer() -> JsonTokenizer:
    return JsonTokenizer(tiny_tokenizer_json(), eos_id=0)


def _jsonl_store(tmp_path, files: int):
    store = open_store(f"file://{tmp_path / 'data'}")
    per = -(-len(DOCS) // files)
    for i in range(files):
        store.put(f"corpus/part-{i:03d}.jsonl", jsonl(DOCS[i * per : (i + 1) * per]))
    store.put("corpus/README.md", b"not data")  # other files under the prefix are not read
    return store


def test_a_tokenizer_json_encodes_and_decodes_and_must_fit_the_model(tokenizer):
    ids = tokenizer.encode("the owl hears the fox by the river.")
    assert tokenizer.decode(ids) == "the owl hears the fox by the river."
    assert len(ids) < len("the owl hears the fox by the river.")  # BPE merged something
    assert tokenizer.vocab_size == 320 and ByteTokenizer().encode("é") == [0xC3, 0xA9]
    with pytest.raises(TokenizerError, match="not a tokenizer.json"):
        JsonTokenizer(b'{"not": "a tokenizer"}')


@pytest.mark.parametrize("files", [4, 3, 1])  # the split is by bytes, whatever the number of files
def test_two_learners_of_two_ranks_cover_the_training_documents_disjointly_in_a_fixed_order(tmp_path, files):
    store = _jsonl_store(tmp_path, files)
    keys = dataset_keys(store, "corpus", "jsonl")
    assert keys == tuple(f"corpus/part-{i:03d}.jsonl" for i in range(files))
    ds = TextDataset(keys=keys, format="jsonl", eval_every_nth=10)
    learners, ranks = 2, 2
    shards = {}
    for learner in range(learners):
        for rank in range(ranks):
            s = learner * ranks + rank
            docs = list(shard_documents(store, ds, shard=s, shards=learners * ranks))
            again = list(shard_documents(store, ds, shard=s, shards=learners * ranks))
            assert docs == again and docs
            shards[s] = [(d.file, d.index) for d in docs]
    everything = [(d.file, d.index) for d in documents(store, ds) if not held_out(keys[d.file], d.index, 10)]
    flat = [pair for s in sorted(shards) for pair in shards[s]]
    assert sorted(flat) == sorted(everything) and len(set(flat)) == len(flat)
    held = [d for d in documents(store, ds) if held_out(keys[d.file], d.index, 10)]
    assert held and not {(d.file, d.index) for d in held} & set(flat)
    # In file order: shard s's documents all come before shard s + 1's.
    assert flat == sorted(flat)


def test_jsonl_and_parquet_of_the_same_documents_stream_the_same_windows(tmp_path, tokenizer):
    store = open_store(f"file://{tmp_path / 'data'}")
    store.put("j/data.jsonl", jsonl(DOCS, field="body"))
    store.put("p/data.parquet", parquet(DOCS, column="body"))

    def windows(prefix, fmt):
        # Nothing held out: which documents are is chosen by key name, and these differ.
        ds = TextDataset(keys=(f"{prefix}/data.{fmt}",), format=fmt, text_field="body", eval_every_nth=0)
        # One shard: JSONL splits by bytes, Parquet by rows, so their halves differ.
        s = TokenStream(store, ds, tokenizer, block_size=16, batch_size=4)
        return [s.next() for _ in range(6)]

    ds_j = TextDataset(keys=("j/data.jsonl",), format="jsonl", text_field="body")
    ds_p = TextDataset(keys=("p/data.parquet",), format="parquet", text_field="body")
    assert [d.text for d in documents(store, ds_j)] == [d.text for d in documents(store, ds_p)] == DOCS
    a, b = windows("j", "jsonl"), windows("p", "parquet")
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b, strict=True))
    x, y = a[0]
    assert x.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    assert torch.equal(x[1, 0:1], y[0, -1:])  # windows follow on from each other
    with pytest.raises(DatasetError, match="no column 'text'"):
        next(documents(store, TextDataset(keys=("p/data.parquet",), format="parquet")))
    with pytest.raises(DatasetError, match="line 1: no string field 'text'"):
        next(documents(store, TextDataset(keys=("j/data.jsonl",), format="jsonl")))


def test_documents_are_separated_by_the_end_of_sequence_token(tmp_path, tokenizer):
    store = open_store(f"file://{tmp_path / 'data'}")
    store.put("d.jsonl", jsonl(["the cat.", "the dog."]))
    ds = TextDataset(keys=("d.jsonl",), format="jsonl", eval_every_nth=0)
    stream = TokenStream(store, ds, tokenizer, block_size=len(tokenizer.encode("the cat.")), batch_size=1)
    x, y = stream.next()
    assert x[0].tolist() == tokenizer.encode("the cat.") and y[0, -1].item() == 0


def test_a_stream_rebuilt_at_its_position_gives_the_windows_that_would_have_come_next(tmp_path, tokenizer):
    store = _jsonl_store(tmp_path, 3)
    ds = TextDataset(keys=dataset_keys(store, "corpus", "jsonl"), format="jsonl")
    first = TokenStream(store, ds, tokenizer, block_size=12, batch_size=3, shard=2, shards=4)
    for _ in range(7):
        first.next()
    where = first.position()
    assert where.offset > 0 or where.document > 0
    resumed = TokenStream(
        store, ds, tokenizer, block_size=12, batch_size=3, shard=2, shards=4, position=where
    )
    for _ in range(30):  # past the end of the shard: the next epoch starts in the same order
        a, b = first.next(), resumed.next()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert first.position().epoch >= 1 and first.position() == resumed.position()
    skipped = TokenStream(store, ds, tokenizer, block_size=12, batch_size=3, shard=2, shards=4)
    skipped.skip(37 * 3)
    assert skipped.position() == first.position()
    assert StreamPosition(**where.as_dict()) == where


def test_a_stream_restored_from_its_saved_state_continues_where_the_saved_one_stood(tmp_path, tokenizer):
    # What a learner checkpoint keeps of a text stream (training.engine.learner._sampler_state).
    store = _jsonl_store(tmp_path, 3)
    ds = TextDataset(keys=dataset_keys(store, "corpus", "jsonl"), format="jsonl")
    first = TokenStream(store, ds, tokenizer, block_size=12, batch_size=3, shard=1, shards=2)
    for _ in range(5):
        first.next()
    saved = torch.as_tensor(first.get_state(), dtype=torch.uint8)
    restored = TokenStream(store, ds, tokenizer, block_size=12, batch_size=3, shard=1, shards=2)
    restored.next()  # a stream that had moved elsewhere is put back, not advanced from there
    restored.set_state(saved)
    assert restored.position() == first.position()
    for _ in range(10):
        a, b = first.next(), restored.next()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_large_text_file_is_cut_into_pieces_at_line_ends_without_losing_a_byte(tmp_path):
    line = "the fox finds the owl on the hill — ünïcödé.\n"
    text = line * (3 * TEXT_PIECE_BYTES // len(line.encode()) + 7)
    store = open_store(f"file://{tmp_path / 'data'}")
    store.put("books/one.txt", text.encode())
    store.put("books/.hidden", b"skipped")
    ds = TextDataset(keys=dataset_keys(store, "books", "text"), format="text")
    assert ds.keys == ("books/one.txt",)
    pieces = list(documents(store, ds))
    assert len(pieces) >= 3 and "".join(p.text for p in pieces) == text
    assert all(p.text.endswith("\n") for p in pieces)
    assert [p.ends_source for p in pieces] == [False] * (len(pieces) - 1) + [True]
    # The pieces shard across two learners like documents.
    a = list(shard_documents(store, ds, shard=0, shards=2))
    b = list(shard_documents(store, ds, shard=1, shards=2))
    assert a and b and not {p.index for p in a} & {p.index for p in b}


def test_eval_windows_come_only_from_held_out_documents_and_are_the_same_every_time(tmp_path):
    store = _jsonl_store(tmp_path, 3)
    ds = TextDataset(keys=dataset_keys(store, "corpus", "jsonl"), format="jsonl", eval_every_nth=5)
    batches = eval_batches(store, ds, ByteTokenizer(), block_size=16, windows=20, batch_size=8)
    assert [len(x) for x, _ in batches] == [8, 8, 4]
    again = eval_batches(store, ds, ByteTokenizer(), block_size=16, windows=20, batch_size=8)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    held_text = "".join(d.text for d in documents(store, ds) if held_out(ds.keys[d.file], d.index, 5))
    first = bytes(batches[0][0][0].tolist()).decode()
    assert first in held_text
    with pytest.raises(DatasetError, match="no held-out text"):
        eval_batches(
            store,
            TextDataset(keys=ds.keys, format="jsonl", eval_every_nth=0),
            ByteTokenizer(),
            block_size=16,
            windows=4,
        )


def test_a_jsonl_dataset_streams_from_s3(s3_server, tmp_path, tokenizer):
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="byo-stream")
    s3 = open_store("s3://byo-stream", endpoint_url=s3_server)
    local = _jsonl_store(tmp_path, 3)
    for key in local.list("corpus/"):
        s3.put(key, local.get(key))
    keys = dataset_keys(s3, "corpus/", "jsonl")
    assert keys == dataset_keys(local, "corpus", "jsonl")
    ds = TextDataset(keys=keys, format="jsonl")
    from_s3 = TokenStream(s3, ds, tokenizer, block_size=16, batch_size=4, shard=1, shards=2)
    from_file = TokenStream(local, ds, tokenizer, block_size=16, batch_size=4, shard=1, shards=2)
    for _ in range(5):
        assert torch.equal(from_s3.next()[0], from_file.next()[0])
    with pytest.raises(DatasetError, match="no jsonl objects"):
        dataset_keys(s3, "nothing-here", "jsonl")
    assert json.loads(s3.get(keys[0]).splitlines()[0])["id"] == 0
