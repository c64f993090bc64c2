"""A learner restored from its checkpoint in a fresh process continues exactly where it stopped."""

from __future__ import annotations

import torch

from storage.objectstore import open_store
from training.engine.checkpoint import CheckpointStore
from training.engine.config import CompressionConfig, InnerConfig
from training.engine.data import BatchSampler
from training.engine.fragments import assign_fragments
from training.engine.learner import Learner
from training.engine.model import build_model

INNER = InnerConfig(lr=3e-3, warmup_steps=3, total_steps=40, batch_size=4)


def _learner(cfg, corpus, *, seed: int = 0, init_seed: int = 0) -> Learner:
    init = {n: p.detach().clone() for n, p in build_model(cfg, seed=init_seed).named_parameters()}
    return Learner(
        learner_id=3,
        model_cfg=cfg,
        inner=INNER,
        fragments=assign_fragments(init, fragments=2),
        sampler=BatchSampler(corpus.train, block_size=cfg.block_size, batch_size=4, seed=seed),
        init=init,
        compression=CompressionConfig(kind="4bit", error_feedback=True),
        device="cpu",
    )


def _chunk_one(learner: Learner) -> None:
    learner.train(5)
    learner.make_delta(0)  # leaves an anchor, a push counter and an error-feedback residual
    learner.train(3)  # and pending steps on both fragments


def _exp_avg(learner: Learner) -> list[torch.Tensor]:
    return [learner.opt.state[p]["exp_avg"] for p in learner.params.values()]


def test_two_chunks_in_two_processes_equal_one_process_running_both(tiny_cfg, stdlib_small, tmp_path):
    store = CheckpointStore(open_store(f"file://{tmp_path}/objects"), prefix="runs/9")
    one = _learner(tiny_cfg, stdlib_small)
    _chunk_one(one)
    key = store.write(3, 0, 0, one, {"note": "chunk 0"})
    assert key == "runs/9/learners/l0003/g000000-c00000000.syd"

    # "Another process": a learner built from other weights and a fresh sampler, then restored.
    other = _learner(tiny_cfg, stdlib_small, init_seed=5)
    assert store.load(3, 0, 0, other) == {"note": "chunk 0"}
    for a, b in zip(_exp_avg(one), _exp_avg(other), strict=True):  # AdamW state came back
        assert torch.equal(a, b)
    assert other.step_count == one.step_count == 8 and other.pending_steps == one.pending_steps == [3, 8]

    for learner in (one, other):  # chunk 1
        learner.train(6)
    d_one, d_other = one.make_delta(1), other.make_delta(1)
    assert d_one.id == d_other.id and d_one.steps == d_other.steps == 14
    for name in d_one.tensors:
        assert torch.equal(d_one.tensors[name].values, d_other.tensors[name].values)
    for name, p in one.params.items():
        assert torch.equal(p, other.params[name]), name
    for a, b in zip(_exp_avg(one), _exp_avg(other), strict=True):
        assert torch.equal(a, b)


def test_a_learner_without_its_adamw_state_diverges(tiny_cfg, stdlib_small):
    """The control for the test above: same weights and data, fresh moments, other parameters."""
    one = _learner(tiny_cfg, stdlib_small)
    _chunk_one(one)
    meta, tensors = one.state_dict()
    fresh = _learner(tiny_cfg, stdlib_small)
    fresh.load_state_dict({**meta, "opt_keys": {}}, tensors)  # everything but the optimizer
    one.train(2)
    fresh.train(2)
    assert any(not torch.equal(p, fresh.params[n]) for n, p in one.params.items())


def test_checkpoints_are_found_by_the_chunk_that_wrote_them_never_a_newer_one(tmp_path):
    store = CheckpointStore(open_store(f"file://{tmp_path}/objects"), prefix="runs/1")
    for gc in [(0, 0), (0, 1), (0, 2), (1, 0)]:
        store.store.put(store.key(2, *gc), b"x")
    store.store.put(store.key(3, 5, 5), b"y")  # another learner's
    assert store.list(2) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert store.latest_before(2, 0, 2) == (0, 1)  # chunk 2 run again: not its own first attempt's
    assert store.latest_before(2, 1, 0) == (0, 2)  # a re-placed learner: its last generation's last
    assert store.latest_before(2, 2, 0) == (1, 0)
    assert store.latest_before(2, 0, 0) is None
    # Pruning keeps what the next chunk and a re-run of the newest chunk start from.
    assert store.prune(2, keep=2) == 2
    assert store.list(2) == [(0, 2), (1, 0)] and store.list(3) == [(5, 5)]
    assert store.latest_before(2, 1, 1) == (1, 0) and store.latest_before(2, 1, 0) == (0, 2)


def test_forgetting_pending_steps_moves_the_anchor_to_the_local_parameters(tiny_cfg, stdlib_small):
    learner = _learner(tiny_cfg, stdlib_small)
    learner.train(4)
    learner.forget_pending(1)
    assert learner.pending_steps == [4, 0] and learner.pending_tokens[1] == 0
    delta = learner.make_delta(1)
    assert delta.steps == 0 and all(float(t.abs().max()) == 0.0 for t in delta.decoded().values())
    assert learner.make_delta(0).steps == 4
