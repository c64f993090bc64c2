"""Byte-level corpora and their sharding across learners.

Three sources, all read at run time:

* the Python standard library's own source files (``sysconfig.get_paths()['stdlib']``), in
  sorted relative-path order, with every n-th file held out for eval;
* user text files given by path;
* objects in the object store (see :mod:`storage.objectstore`).

A :class:`Corpus` is a train byte stream plus an eval byte stream. Learners draw random
windows from their shard: ``iid`` shards sample the whole train stream with a per-learner
seed; ``noniid`` shards give each learner a contiguous slice of the stream (files are in
path order, so a slice is a few stdlib packages: a strongly skewed split).
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from storage.objectstore import ObjectStore
from training.engine.config import DataConfig, Sharding

# Large, machine-generated or test-only trees that add little but bytes to the corpus.
_SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8, 1-D
    eval: torch.Tensor  # uint8, 1-D
    train_files: int
    eval_files: int


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every ``.py`` file of the stdlib, minus tests and site-packages, in sorted path order.

    The skipped trees are pruned as the walk meets them, never entered: globbing the whole
    stdlib and filtering afterwards cost about 1 s of CPU per corpus load (the test tree alone
    holds most of its files), this about 15 ms."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        found.extend(Path(folder, f) for f in files if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())


def _split(blobs: Iterable[bytes], *, every_nth: int, max_train: int, max_eval: int) -> Corpus:
    train: list[bytes] = []
    held: list[bytes] = []
    n_train = n_eval = 0
    n_train_bytes = n_eval_bytes = 0
    for i, blob in enumerate(blobs):
        if every_nth > 0 and i % every_nth == 0:
            if n_eval_bytes < max_eval:
                held.append(blob)
                n_eval += 1
                n_eval_bytes += len(blob)
        elif n_train_bytes < max_train:
            train.append(blob)
            n_train += 1
            n_train_bytes += len(blob)
        if n_train_bytes >= max_train and n_eval_bytes >= max_eval:
            break
    if not held:  # a single file: hold out its tail instead
        joined = b"".join(train)
        cut = max(1, len(joined) * 9 // 10)
        train, held = [joined[:cut]], [joined[cut:]]
    return Corpus(
        train=_as_tensor(b"".join(train)[:max_train]),
        eval=_as_tensor(b"".join(held)[:max_eval]),
        train_files=n_train,
        eval_files=n_eval,
    )


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def stdlib_corpus(cfg: DataConfig) -> Corpus:
    """The stdlib-source corpus; deterministic for a given Python installation."""
    return _split(
        (p.read_bytes() for p in stdlib_files()),
        every_nth=cfg.eval_every_nth_file,
        max_train=cfg.max_train_bytes,
        max_eval=cfg.max_eval_bytes,
    )


def files_corpus(paths: Sequence[str | Path], cfg: DataConfig) -> Corpus:
    """User text files, in the order given."""
    return _split(
        (Path(p).read_bytes() for p in paths),
        every_nth=cfg.eval_every_nth_file,
        max_train=cfg.max_train_bytes,
        max_eval=cfg.max_eval_bytes,
    )


def object_corpus(store: ObjectStore, keys: Sequence[str], cfg: DataConfig) -> Corpus:
    """Objects from the object store, in the order given."""
    return _split(
        (store.get(k) for k in keys),
        every_nth=cfg.eval_every_nth_file,
        max_train=cfg.max_train_bytes,
        max_eval=cfg.max_eval_bytes,
    )


def load_corpus(cfg: DataConfig, *, store: ObjectStore | None = None) -> Corpus:
    if cfg.source == "stdlib":
        return stdlib_corpus(cfg)
    if cfg.source == "files":
        return files_corpus(cfg.paths, cfg)
    if store is None:
        raise ValueError("source='objects' needs a store")
    return object_corpus(store, cfg.paths, cfg)


def shard(data: torch.Tensor, *, index: int, count: int, sharding: Sharding) -> torch.Tensor:
    """The part of the train stream learner ``index`` of ``count`` samples from."""
    if sharding == "iid" or count == 1:
        return data
    size = len(data) // count
    return data[index * size : (index + 1) * size]


class Sampler(Protocol):
    """What a learner draws batches from: BatchSampler here, TokenStream (training.engine.stream)."""

    batch_size: int
    block_size: int

    def next(self) -> tuple[torch.Tensor, torch.Tensor]: ...


class BatchSampler:
    """Random (x, y) windows of ``block_size`` bytes from a stream, from a seeded generator."""

    def __init__(self, data: torch.Tensor, *, block_size: int, batch_size: int, seed: int):
        if len(data) <= block_size + 1:
            raise ValueError("stream shorter than one window")
        self.data = data
        self.block_size = block_size
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(self.data) - self.block_size - 1, (self.batch_size,), generator=self.gen)
        offsets = torch.arange(self.block_size + 1)
        win = self.data[starts[:, None] + offsets].long()
        return win[:, :-1].contiguous(), win[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()


def eval_batches(
    data: torch.Tensor, *, block_size: int, windows: int, batch_size: int = 64, seed: int = 1234
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of eval windows: the same bytes for every run that uses the same seed."""
    sampler = BatchSampler(data, block_size=block_size, batch_size=batch_size, seed=seed)
    out = []
    left = windows
    while left > 0:
        x, y = sampler.next()
        out.append((x[:left], y[:left]))
        left -= len(x)
    return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean cross-entropy (nats per byte) over fixed eval batches."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = 0.0
    count = 0
    for x, y in batches:
        total += float(model(x.to(device), y.to(device))) * x.numel()
        count += x.numel()
    model.train(was_training)
    return total / count if count else float("nan")
