"""Running one spec of the DiLoCo benchmark on the engine's simulator (real compute on a virtual
clock), and the learner's overhead against a bare torch loop."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from training.engine.config import (
    CompressionConfig,
    StreamingConfig,
    SyncerConfig,
)
from training.engine.data import BatchSampler, Corpus, eval_batches, load_corpus
from training.engine.learner import Learner
from training.engine.model import build_model, param_count
from training.engine.simulator import (
    LearnerSpec,
    NetworkConfig,
    SimConfig,
    Simulator,
    train_data_parallel,
)

if TYPE_CHECKING:
    from bench.diloco.specs import Profile, RunSpec


_CACHE: dict[str, tuple[Corpus, list[tuple[torch.Tensor, torch.Tensor]]]] = {}


def _data(p: Profile) -> tuple[Corpus, list[tuple[torch.Tensor, torch.Tensor]]]:
    if p.name not in _CACHE:
        corpus = load_corpus(p.data)
        evals = eval_batches(corpus.eval, block_size=p.model.block_size, windows=p.eval_windows)
        _CACHE[p.name] = (corpus, evals)
    return _CACHE[p.name]


def run_spec(p: Profile, spec: RunSpec) -> dict[str, Any]:
    torch.set_num_threads(1)
    corpus, evals = _data(p)
    size = 4 * param_count(build_model(p.model, seed=p.seed))  # S, fp32 bytes
    steps = spec.steps or p.steps
    inner = replace(p.inner, schedule="constant") if spec.constant_lr else p.inner
    record: dict[str, Any] = {
        "name": spec.name,
        "method": spec.method,
        "M": spec.m,
        "H": spec.h or None,
        "P": spec.fragments,
        "outer_lr": spec.outer_lr if spec.method != "data_parallel" else None,
        "compression": spec.compression,
        "batch_per_learner": spec.batch_per_learner,
        "steps_per_learner": steps,
        "model_bytes_fp32": size,
        **spec.tags,
    }
    if spec.method == "data_parallel":
        dp = train_data_parallel(
            model_cfg=p.model,
            inner=inner,
            corpus=corpus,
            eval_set=evals,
            batch_size=spec.batch_per_learner,
            steps=steps,
            seed=p.seed,
        )
        # Ring all-reduce: each of M workers sends 2(M−1)/M·S per step.
        per_learner = {m: steps * 2 * (m - 1) * size // m for m in (2, 4, 8)}
        record.update(
            eval_loss=dp.eval_loss,
            real_seconds=dp.real_seconds,
            tokens=dp.tokens,
            bytes_sent_per_learner=per_learner,
            bytes_received_per_learner=dict(per_learner),  # a ring all-reduce receives as much
            virtual_seconds=float(steps),
            peak_bytes_per_sync=None,
        )
        return record
    specs = []
    for i in range(spec.m):
        slow = spec.slow[i] if i < len(spec.slow) else 1.0
        fail = next(((a, b) for j, a, b in spec.fail if j == i), (None, None))
        sched = None
        if spec.time_limit is not None:
            sched = int(spec.time_limit / slow)
        specs.append(
            LearnerSpec(
                step_time=slow,
                batch_size=spec.batch_per_learner,
                schedule_steps=sched,
                fail_at=fail[0],
                recover_at=fail[1],
            )
        )
    cfg = SimConfig(
        model=p.model,
        inner=inner,
        learners=tuple(specs),
        h=spec.h,
        outer=replace(p.outer, lr=spec.outer_lr),
        streaming=StreamingConfig(fragments=spec.fragments, overlap=spec.overlap, alpha=spec.alpha),
        compression=CompressionConfig(kind=spec.compression),
        syncer=SyncerConfig(learners=spec.m, quorum=spec.quorum, grace=spec.grace),
        network=NetworkConfig(),
        mode=spec.mode,
        max_steps=None if spec.time_limit is not None else steps,
        time_limit=spec.time_limit,
        eval_every=spec.eval_every,
        seed=p.seed,
    )
    sim = Simulator(cfg, corpus, evals, device="cpu")
    r = sim.run()
    record.update(
        eval_loss=r.eval_loss,
        real_seconds=r.real_seconds,
        virtual_seconds=r.virtual_seconds,
        tokens=r.tokens_trained,
        tokens_merged=r.tokens_merged,
        tokens_lost=r.tokens_lost,
        bytes_sent_per_learner=statistics.mean(r.bytes_up),
        bytes_received_per_learner=statistics.mean(r.bytes_down),
        peak_bytes_per_sync=r.peak_push_bytes,
        flush_bytes=r.flush_bytes,
        publishes=r.publishes,
        steps_per_learner=[rt.steps for rt in sim.rts],
        curve=[dict(pt) for pt in r.curve if "eval_loss" in pt] if spec.eval_every else [],
        merged_curve=[(round(pt["time"], 3), int(pt["tokens_merged"])) for pt in r.curve]
        if spec.fail or spec.tags.get("goodput")
        else [],
    )
    return record


def measure_overhead(p: Profile, *, rounds: int = 20) -> dict[str, Any]:
    """tokens/s of Learner.train_step vs a bare loop, interleaved so both see the same load."""
    torch.set_num_threads(1)
    corpus, _ = _data(p)
    init = {n: t.detach().clone() for n, t in build_model(p.model, seed=p.seed).named_parameters()}

    def sampler() -> BatchSampler:
        return BatchSampler(corpus.train, block_size=p.model.block_size, batch_size=p.batch, seed=7)

    learner = Learner(
        learner_id=0,
        model_cfg=p.model,
        inner=p.inner,
        fragments=[list(init)],
        sampler=sampler(),
        init=init,
        device="cpu",
    )
    bare = build_model(p.model, seed=p.seed)
    opt = torch.optim.AdamW(
        bare.parameters(), lr=p.inner.lr, betas=p.inner.betas, weight_decay=p.inner.weight_decay
    )
    bare_sampler = sampler()

    def bare_step() -> None:
        x, y = bare_sampler.next()
        bare(x, y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def rate(step: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(p.overhead_steps):
            step()
        return p.batch * p.model.block_size * p.overhead_steps / (time.perf_counter() - t0)

    for _ in range(3):  # warm both up
        learner.train_step()
        bare_step()
    # Short blocks in alternating order (engine first, then bare first) so that a burst of
    # load on this shared machine hits both sides alike; the median of the per-round ratios
    # then discards the rounds a burst split unevenly.
    eng, ref, ratios = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            e, b = rate(learner.train_step), rate(bare_step)
        else:
            b, e = rate(bare_step), rate(learner.train_step)
        eng.append(e)
        ref.append(b)
        ratios.append(e / b)
    return {
        "name": "learner_overhead",
        "method": "overhead",
        "steps_per_block": p.overhead_steps,
        "engine_tokens_per_s": eng,
        "bare_tokens_per_s": ref,
        "ratio": statistics.median(ratios),
    }
