"""A short training benchmark on a GPU: the learner in bf16 autocast, and 2 NCCL ranks if there are two GPUs.

python -m bench.gpu --json var/bench-gpu.json [--steps 300]

Run by scripts/gpu_check.sh. A 6-layer byte-level GPT (width 384, context 256, about 10.7M
parameters) trains ``--steps`` inner steps at batch 32 on the stdlib corpus from a seeded
initialisation; it prints JSON: tokens per second (after 20 warm-up steps, CUDA synchronised),
the first and last train losses, eval loss before and after, and peak GPU memory. With two or
more GPUs it also trains the same steps as one learner of 2 NCCL ranks (batch 16 each,
training.engine.distributed) and reports ``ddp_loss_ratio`` (eval loss, 2 ranks ÷ 1) and the
2-rank tokens per second. Benchmarks measure; tests never assert on these figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training.engine.config import DataConfig, InnerConfig, ModelConfig
from training.engine.data import BatchSampler, Corpus, eval_batches, evaluate, load_corpus
from training.engine.learner import Learner
from training.engine.model import build_model, make_model

MODEL = ModelConfig(n_layer=6, n_embd=384, n_head=6, block_size=256)
BATCH = 32
WARMUP = 20


def _eval(params: Mapping[str, torch.Tensor], batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model = make_model(MODEL).cuda()
    model.load_state_dict({k: v.detach() for k, v in params.items()})
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return evaluate(model, batches)


def _learner(
    corpus: Corpus, init: dict[str, torch.Tensor], inner: InnerConfig, *, per_rank: int, ranks: int
) -> Learner:
    sampler = BatchSampler(corpus.train, block_size=MODEL.block_size, batch_size=per_rank, seed=1)
    return Learner(
        learner_id=0,
        model_cfg=MODEL,
        inner=inner,
        fragments=[list(init)],
        sampler=sampler,
        init=init,
        ranks=ranks,
    )


def _timed(learner: Learner, steps: int) -> tuple[list[float], float]:
    losses = learner.train(WARMUP)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses += learner.train(steps - WARMUP)
    torch.cuda.synchronize()
    return losses, time.perf_counter() - t0


def run(steps: int) -> dict[str, Any]:
    corpus = load_corpus(DataConfig(max_train_bytes=4_000_000, max_eval_bytes=400_000))
    held_out = eval_batches(corpus.eval, block_size=MODEL.block_size, windows=256)
    init = {n: p.detach().clone() for n, p in build_model(MODEL, seed=0).named_parameters()}
    inner = InnerConfig(lr=1e-3, warmup_steps=50, total_steps=steps, batch_size=BATCH)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "parameters": sum(t.numel() for t in init.values()),
        "steps": steps,
        "batch": BATCH,
        "block_size": MODEL.block_size,
    }
    torch.cuda.reset_peak_memory_stats()
    one = _learner(corpus, init, inner, per_rank=BATCH, ranks=1)
    losses, seconds = _timed(one, steps)
    tokens = (steps - WARMUP) * BATCH * MODEL.block_size
    out.update(
        {
            "tokens_per_s": round(tokens / seconds),
            "ms_per_step": round(1000 * seconds / (steps - WARMUP), 2),
            "train_loss_first": round(losses[0], 4),
            "train_loss_last": round(sum(losses[-10:]) / 10, 4),
            "eval_loss_init": round(_eval(init, held_out), 4),
            "eval_loss_final": round(_eval(one.params, held_out), 4),
            "peak_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20),
        }
    )
    if torch.cuda.device_count() >= 2:
        from training.engine.distributed import group_start

        two = _learner(corpus, init, inner, per_rank=BATCH // 2, ranks=2)
        spec = {"kind": "bytes", "block_size": MODEL.block_size, "batch_size": BATCH // 2, "seed": 2}
        group = group_start(two, samplers=[(spec, {"data": corpus.train})])
        try:
            _, seconds2 = _timed(two, steps)
        finally:
            group.finish()
        ddp_eval = _eval(two.params, held_out)
        out["ddp_tokens_per_s"] = round(tokens / seconds2)
        out["ddp_eval_loss"] = round(ddp_eval, 4)
        out["ddp_loss_ratio"] = round(ddp_eval / out["eval_loss_final"], 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu")
    parser.add_argument("--json", required=True, help="where to write the figures")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if args.steps <= WARMUP:
        print(f"bench_gpu: --steps must be more than {WARMUP}", file=sys.stderr)
        return 2
    out = run(args.steps)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
