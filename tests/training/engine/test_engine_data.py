"""Corpora and sharding: deterministic, held-out eval, three sources."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from storage.objectstore import open_store
from training.engine.config import DataConfig
from training.engine.data import (
    BatchSampler,
    files_corpus,
    load_corpus,
    object_corpus,
    shard,
    stdlib_files,
)


def test_stdlib_files_come_in_sorted_path_order_without_tests_or_site_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    rel = [p.relative_to(root).as_posix() for p in files]
    assert rel == sorted(rel) and len(rel) > 100
    assert not any(part in ("test", "tests", "site-packages") for r in rel for part in r.split("/")[:-1])


def test_eval_bytes_come_from_held_out_files(stdlib_small):
    cfg = DataConfig(max_train_bytes=300_000, max_eval_bytes=60_000, eval_every_nth_file=10)
    again = load_corpus(cfg)
    assert torch.equal(again.train, stdlib_small.train) and torch.equal(again.eval, stdlib_small.eval)
    files = stdlib_files()
    first_eval, first_train = files[0].read_bytes(), files[1].read_bytes()
    assert bytes(stdlib_small.eval[:200].tolist()) == first_eval[:200]
    assert bytes(stdlib_small.train[:200].tolist()) == first_train[:200]


def test_user_files_and_stored_objects_make_the_same_corpus(tmp_path):
    texts = [f"file {i}: ".encode() + bytes(range(32, 127)) * 3 for i in range(6)]
    paths = []
    store = open_store(f"file://{tmp_path}/objects")
    for i, text in enumerate(texts):
        path = tmp_path / f"doc{i}.txt"
        path.write_bytes(text)
        paths.append(str(path))
        store.put(f"corpus/doc{i}.txt", text)
    cfg = DataConfig(eval_every_nth_file=3)
    from_files = files_corpus(paths, cfg)
    from_store = object_corpus(store, [f"corpus/doc{i}.txt" for i in range(6)], cfg)
    assert torch.equal(from_files.train, from_store.train)
    assert torch.equal(from_files.eval, from_store.eval)
    assert from_files.eval_files == 2 and from_files.train_files == 4


def test_noniid_shards_are_disjoint_slices_and_iid_shards_see_everything():
    data = torch.arange(100, dtype=torch.uint8)
    parts = [shard(data, index=i, count=4, sharding="noniid") for i in range(4)]
    assert torch.equal(torch.cat(parts), data)
    assert torch.equal(shard(data, index=2, count=4, sharding="iid"), data)


def test_a_seeded_sampler_repeats_its_windows(stdlib_small):
    a = BatchSampler(stdlib_small.train, block_size=16, batch_size=3, seed=5)
    b = BatchSampler(stdlib_small.train, block_size=16, batch_size=3, seed=5)
    xa, ya = a.next()
    xb, yb = b.next()
    assert torch.equal(xa, xb) and torch.equal(ya[:, :-1], xa[:, 1:])
