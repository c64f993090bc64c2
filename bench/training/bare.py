"""The training benchmark's baseline: the same learners on the bare engine, without Switchyard.

One process per learner with one torch thread (as each worker has), deltas and versions through
a file:// object-store transport, the syncer in the calling process. No Celery, no database, no
chunks: bench.training.runs compares its tokens/s with the orchestrated run's.

This module imports no Django models: the learner processes are spawned, import only this
module (to find their target) and never set Django up. It imports torch at the top; only the
benchmark command loads it.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from typing import Any

import torch

from storage.objectstore import open_store
from training.engine.data import BatchSampler, load_corpus
from training.engine.fragments import assign_fragments
from training.engine.learner import Learner
from training.engine.model import build_model
from training.engine.syncer import Syncer
from training.engine.transport import ObjectStoreTransport, latest_version
from training.run_config import RunConfig, run_config_validate


def _bare_learner(
    index: int, raw: dict[str, Any], store_url: str, seconds: float, barrier: Any, results: Any
) -> None:
    """One bare-engine learner in its own process (no Django, no broker, no database)."""
    torch.set_num_threads(1)
    rc = RunConfig(raw)
    params = {
        n: p.detach().clone() for n, p in build_model(rc.model_config(), seed=rc.seed).named_parameters()
    }
    fragments = assign_fragments(params, fragments=rc.fragment_count)
    corpus = load_corpus(rc.data_config())
    transport = ObjectStoreTransport(open_store(store_url), prefix="bare")
    learner = Learner(
        learner_id=index,
        model_cfg=rc.model_config(),
        inner=rc.inner_config(),
        fragments=fragments,
        sampler=BatchSampler(
            corpus.train, block_size=rc.model_config().block_size, batch_size=rc.batch_size, seed=index + 1
        ),
        init=params,
        compression=rc.compression_config(),
    )
    barrier.wait()  # every learner is set up: the clocks start together
    start = time.monotonic()
    tokens = 0
    pushed_base: dict[int, int] = {}
    while time.monotonic() - start < seconds:
        learner.train(rc.h)
        tokens += rc.h * learner.tokens_per_step
        for f in range(len(fragments)):
            found = transport.versions(f)
            if found and max(found) > learner.base_version[f]:
                newer = latest_version(transport, f)
                if newer is not None:
                    learner.adopt(f, newer.params, newer.version, how="rebase")
            # As the orchestrated learner does: one delta per fragment waits for the syncer.
            if f not in pushed_base or learner.base_version[f] > pushed_base[f]:
                pushed_base[f] = learner.base_version[f]
                transport.put_delta(learner.make_delta(f, now=time.time()))
    results.put((tokens, time.monotonic() - start))


def bare_engine_run(cfg: dict[str, Any], *, seconds: float) -> dict[str, float]:
    """The same learners with the bare engine: one process per learner with one torch thread
    (as each worker has), deltas and versions through a file:// object-store transport, the
    syncer merging in this process every half second, learners rebasing onto new versions.
    Only the orchestration is missing: no Celery, no database, no chunks, no evaluation."""
    torch.set_num_threads(1)
    raw = run_config_validate(cfg)
    rc = RunConfig(raw)
    params = {
        n: p.detach().clone() for n, p in build_model(rc.model_config(), seed=rc.seed).named_parameters()
    }
    fragments = assign_fragments(params, fragments=rc.fragment_count)
    with tempfile.TemporaryDirectory(prefix="bench-bare-") as tmp:
        store_url = f"file://{tmp}"
        transport = ObjectStoreTransport(open_store(store_url), prefix="bare")
        syncer = Syncer(
            cfg=rc.syncer_config(),
            outer=rc.outer_config(),
            fragments=fragments,
            init=params,
            transport=transport,
        )
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(rc.learners + 1)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_bare_learner, args=(i, raw, store_url, seconds, barrier, results))
            for i in range(rc.learners)
        ]
        for proc in procs:
            proc.start()
        barrier.wait()
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            time.sleep(0.5)
            syncer.pull(time.time())
            syncer.poll(time.time())
        # Read the results before joining: a child exits only once its queue is drained.
        got = [results.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
    tokens = sum(t for t, _ in got)
    wall = max(w for _, w in got)
    return {"tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": tokens / wall}
