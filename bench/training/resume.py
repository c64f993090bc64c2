"""Benchmark figure: a learner stopped and resumed from its checkpoint against one never stopped.

`python manage.py bench training` reports it as ``resume_loss_ratio`` (``--ddp-only`` runs it
too: neither needs workers). Two learners start from the same weights with the same seeded
sampler on the benchmark run's model and stdlib corpus. One trains ``steps`` inner steps in one
go; the other trains half of them, is written to a file:// object store as a learner checkpoint
(training.engine.checkpoint, exactly what a chunk writes), and a new Learner built from nothing
but the config loads it and trains the other half: the same tokens in the same order. The ratio
is the resumed learner's held-out eval loss over the uninterrupted one's; a checkpoint that
kept the weights but dropped the AdamW moments, the step counters (lr schedule, bias
correction) or the data position would show here (target ≤ 1.01).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def resume_bench(cfg: dict[str, Any], *, steps: int = 150) -> dict[str, Any]:
    """Train ``steps`` steps uninterrupted and as two halves through a checkpoint; eval losses."""
    import torch  # lazily: the bench command's other parts do not need torch here

    from storage.objectstore import open_store
    from training.engine.checkpoint import CheckpointStore
    from training.engine.config import DataConfig, InnerConfig, ModelConfig
    from training.engine.data import BatchSampler, eval_batches, evaluate, load_corpus
    from training.engine.learner import Learner
    from training.engine.model import build_model, make_model

    torch.set_num_threads(1)
    model_cfg = ModelConfig(**cfg["model"])
    batch = int(cfg["learners"]["batch_size"])
    inner = InnerConfig(
        lr=float(cfg["inner"]["lr"]),
        warmup_steps=int(cfg["inner"]["warmup_steps"]),
        total_steps=steps,
        batch_size=batch,
    )
    corpus = load_corpus(DataConfig(**cfg["data"]))
    held_out = eval_batches(corpus.eval, block_size=model_cfg.block_size, windows=int(cfg["eval_windows"]))
    init = {n: p.detach().clone() for n, p in build_model(model_cfg, seed=0).named_parameters()}

    def learner() -> Learner:
        sampler = BatchSampler(corpus.train, block_size=model_cfg.block_size, batch_size=batch, seed=1)
        return Learner(
            learner_id=0,
            model_cfg=model_cfg,
            inner=inner,
            fragments=[list(init)],
            sampler=sampler,
            init=init,
            device="cpu",
        )

    def eval_loss(lrn: Learner) -> float:
        model = make_model(model_cfg)
        model.load_state_dict({k: p.detach() for k, p in lrn.params.items()})
        return evaluate(model, held_out)

    t0 = time.monotonic()
    straight = learner()
    straight.train(steps)
    straight_s = time.monotonic() - t0

    half = steps // 2
    t0 = time.monotonic()
    first = learner()
    first.train(half)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoints = CheckpointStore(open_store(f"file://{scratch}"), prefix="runs/bench")
        key = checkpoints.write(0, 0, 0, first)
        checkpoint_bytes = (Path(scratch) / key).stat().st_size
        resumed = learner()  # a fresh process's learner: weights, optimizer and sampler from the config
        checkpoints.load(0, 0, 0, resumed)
    resumed.train(steps - half)
    resumed_s = time.monotonic() - t0
    straight_eval, resumed_eval = eval_loss(straight), eval_loss(resumed)
    return {
        "steps": steps,
        "resumed_after": half,
        "checkpoint_bytes": checkpoint_bytes,
        "eval_loss_uninterrupted": round(straight_eval, 5),
        "eval_loss_resumed": round(resumed_eval, 5),
        "max_param_abs_diff": max(
            float((straight.params[n] - resumed.params[n]).detach().abs().max()) for n in straight.params
        ),
        "seconds_uninterrupted": round(straight_s, 2),
        "seconds_resumed": round(resumed_s, 2),
        "resume_loss_ratio": round(resumed_eval / straight_eval, 4),
    }
