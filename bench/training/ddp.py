"""Benchmark figures: a learner of 2 gloo ranks against 1 rank at the same global batch.

`python manage.py bench training` reports it as ``ddp_loss_ratio``, and with the ranks sharding
the learner (FSDP2, learners.sharding: fsdp) as ``fsdp_loss_ratio`` (``--ddp-only`` runs just
these parts). Both learners start from the same weights and train the same number of inner steps
on the benchmark run's model and stdlib corpus with a global batch of B windows: one process
drawing B windows per step, or two ranks (training.engine.distributed, DDP over gloo) drawing
B/2 each from their own seeded streams, exactly as a run with learners.ranks = 2 does. The
ratio is the 2-rank learner's held-out eval loss over the 1-rank learner's: data-parallel
inside a learner should cost nothing in loss (≤ 1.01). Different batches are drawn, so the
ratio carries sampling noise; wall times are reported alongside, not judged. The 2-rank
learner trains in two sessions of one kept group, as two chunks on one worker do:
``group_start_s`` is the first session's start (helpers started: measured), ``group_start_kept_s``
the second's (the kept group: measured).
"""

from __future__ import annotations

import time
from typing import Any


def ddp_bench(
    cfg: dict[str, Any], *, steps: int = 150, ranks: int = 2, sharding: str = "ddp"
) -> dict[str, Any]:
    """Train one learner with 1 rank and one with ``ranks`` ranks (DDP, or FSDP2 with
    ``sharding="fsdp"``); their eval losses and times, and ``{sharding}_loss_ratio``."""
    import torch  # lazily: the bench command's other parts do not need torch here

    from training.engine.config import DataConfig, InnerConfig, ModelConfig
    from training.engine.data import BatchSampler, eval_batches, evaluate, load_corpus
    from training.engine.distributed import group_release, group_start
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

    def learner(per_rank: int, n: int) -> Learner:
        sampler = BatchSampler(corpus.train, block_size=model_cfg.block_size, batch_size=per_rank, seed=1)
        return Learner(
            learner_id=0,
            model_cfg=model_cfg,
            inner=inner,
            fragments=[list(init)],
            sampler=sampler,
            init=init,
            device="cpu",
            ranks=n,
        )

    def eval_loss(lrn: Learner) -> float:
        model = make_model(model_cfg)
        model.load_state_dict({k: p.detach() for k, p in lrn.params.items()})
        return evaluate(model, held_out)

    one = learner(batch, 1)
    t0 = time.monotonic()
    one_losses = one.train(steps)
    one_s = time.monotonic() - t0

    many = learner(batch // ranks, ranks)
    specs: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = [
        (
            {
                "kind": "bytes",
                "block_size": model_cfg.block_size,
                "batch_size": batch // ranks,
                "seed": 1 + r,
            },
            {"data": corpus.train},
        )
        for r in range(1, ranks)
    ]
    # Two sessions of a kept group, as two chunks of a run's learner on one worker: the first
    # starts the helpers (a Python process each, torch import, gloo rendezvous), the second finds
    # them (training.engine.distributed). Their training is bit-identical to one session's.
    t0 = time.monotonic()
    many_losses: list[float] = []
    starts = []
    for part in (steps // 2, steps - steps // 2):
        group = group_start(many, samplers=specs, key="bench", sharding=sharding)
        starts.append(group.start_seconds)
        try:
            many_losses += many.train(part)
        finally:
            group.finish()
    group_release()
    many_s = time.monotonic() - t0
    one_eval, many_eval = eval_loss(one), eval_loss(many)
    tail = max(1, steps // 10)
    return {
        "steps": steps,
        "global_batch": batch,
        "ranks": ranks,
        "sharding": sharding,
        "eval_loss_1_rank": round(one_eval, 5),
        f"eval_loss_{ranks}_ranks": round(many_eval, 5),
        "train_loss_last_tenth_1_rank": round(sum(one_losses[-tail:]) / tail, 5),
        f"train_loss_last_tenth_{ranks}_ranks": round(sum(many_losses[-tail:]) / tail, 5),
        "seconds_1_rank": round(one_s, 2),
        f"seconds_{ranks}_ranks": round(many_s, 2),
        "group_start_s": round(starts[0], 3),  # a chunk that starts its helpers
        "group_start_kept_s": round(starts[1], 3),  # the learner's next chunk on the same worker
        f"{sharding}_loss_ratio": round(many_eval / one_eval, 4),
    }
