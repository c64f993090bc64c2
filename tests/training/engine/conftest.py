from __future__ import annotations

import pytest
import torch

from training.engine.config import DataConfig, InnerConfig, ModelConfig
from training.engine.data import Corpus, eval_batches, load_corpus

# One torch thread per process: steadier on the shared 2-core machines.
torch.set_num_threads(1)

TINY = ModelConfig(n_layer=2, n_embd=32, n_head=2, block_size=32)


@pytest.fixture(scope="session")
def tiny_cfg() -> ModelConfig:
    return TINY


@pytest.fixture(scope="session")
def stdlib_small() -> Corpus:
    return load_corpus(DataConfig(max_train_bytes=300_000, max_eval_bytes=60_000))


@pytest.fixture(scope="session")
def tiny_eval(stdlib_small: Corpus) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return eval_batches(stdlib_small.eval, block_size=TINY.block_size, windows=64)


@pytest.fixture
def sgd_inner() -> InnerConfig:
    return InnerConfig(
        lr=0.05,
        warmup_steps=0,
        schedule="constant",
        optimizer="sgd",
        grad_clip=0.0,
        weight_decay=0.0,
        batch_size=4,
    )
