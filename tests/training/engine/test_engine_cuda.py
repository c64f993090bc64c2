"""The learner on a GPU: bf16 autocast, fp32 state, a DiLoCo round with a CPU syncer, 2 NCCL ranks.

Marked ``cuda``: they run where ``torch.cuda.is_available()`` (scripts/gpu_check.sh runs them on
a GPU machine) and are skipped, with the reason, everywhere else.
"""

from __future__ import annotations

import pytest
import torch

from tests.training.engine.rank_samplers import SamplerSpec, UnionSampler, bytes_spec
from training.engine.config import CompressionConfig, InnerConfig, ModelConfig, OuterConfig, SyncerConfig
from training.engine.data import BatchSampler, Corpus
from training.engine.learner import Learner
from training.engine.model import build_model
from training.engine.syncer import Syncer
from training.engine.transport import InMemoryTransport

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="no CUDA GPU here (torch.cuda.is_available() is False); scripts/gpu_check.sh runs these on one",
    ),
]

CFG = ModelConfig(n_layer=2, n_embd=64, n_head=4, block_size=32)
INNER = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=40, batch_size=8)


def _init() -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in build_model(CFG, seed=0).named_parameters()}


def _learner(corpus: Corpus, init: dict[str, torch.Tensor], *, seed: int = 0, **kw: object) -> Learner:
    return Learner(
        learner_id=seed,
        model_cfg=CFG,
        inner=INNER,
        fragments=[list(init)],
        sampler=BatchSampler(corpus.train, block_size=CFG.block_size, batch_size=8, seed=seed),
        init=init,
        **kw,  # type: ignore[arg-type]
    )


def _two_ranks(
    corpus: Corpus, init: dict[str, torch.Tensor], **kw: object
) -> tuple[Learner, list[SamplerSpec]]:
    """Rank 0 of a learner of 2 ranks (4 windows each, seeds 100 and 101) and rank 1's recipe."""
    learner = Learner(
        learner_id=0,
        model_cfg=CFG,
        inner=INNER,
        fragments=[list(init)],
        sampler=BatchSampler(corpus.train, block_size=CFG.block_size, batch_size=4, seed=100),
        init=init,
        ranks=2,
        **kw,  # type: ignore[arg-type]
    )
    return learner, [bytes_spec(corpus.train, block_size=CFG.block_size, batch_size=4, seed=101)]


def test_a_learner_trains_in_bf16_autocast_on_the_gpu_and_keeps_its_state_in_fp32(
    stdlib_small: Corpus,
) -> None:
    init = _init()
    learner = _learner(stdlib_small, init)
    assert learner.device.type == "cuda"  # the default device where there is one
    seen: list[torch.dtype] = []
    linear = next(m for m in learner.model.modules() if isinstance(m, torch.nn.Linear))
    handle = linear.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    losses = learner.train(30)
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}  # matmuls ran in bf16
    assert all(torch.isfinite(torch.tensor(losses))) and sum(losses[-5:]) < sum(losses[:5])
    for p in learner.params.values():
        assert p.dtype == torch.float32 and p.device.type == "cuda"
    meta, tensors = learner.state_dict()
    assert all(t.device.type == "cpu" for t in tensors.values())  # checkpoints are CPU tensors
    again = _learner(stdlib_small, init)
    again.load_state_dict(meta, tensors)
    for name, p in learner.params.items():
        assert torch.equal(again.params[name], p)
    exp_avg = again.opt.state[again.params[next(iter(init))]]["exp_avg"]
    assert exp_avg.device.type == "cuda" and exp_avg.dtype == torch.float32


def test_a_diloco_round_with_gpu_learners_and_a_cpu_syncer_comes_back_down_to_the_learners(
    stdlib_small: Corpus,
) -> None:
    init = _init()
    transport = InMemoryTransport()
    syncer = Syncer(
        cfg=SyncerConfig(learners=2),
        outer=OuterConfig(),
        fragments=[list(init)],
        init=init,
        transport=transport,
        down="4bit",
    )
    learners = [
        _learner(stdlib_small, init, seed=i, compression=CompressionConfig(kind="4bit")) for i in range(2)
    ]
    for _ in range(2):
        for learner in learners:
            learner.train(5)
            delta = learner.make_delta(0)
            assert all(t.values.device.type == "cpu" for t in delta.tensors.values())
            transport.put_delta(delta)
        syncer.pull(now=0.0)
        (published,) = syncer.poll(now=0.0)
        for learner in learners:
            learner.receive(transport.get_down(0, published.version))
            assert learner.adopt_held(0, how="rebase")
    for learner in learners:
        assert learner.base_version == [2]
        for name, p in learner.params.items():
            assert torch.isfinite(p).all() and p.device.type == "cuda", name


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="two NCCL ranks need two GPUs"
)
def test_two_nccl_ranks_train_as_one_rank_at_the_same_global_batch(stdlib_small: Corpus) -> None:
    from training.engine.distributed import group_start

    init = _init()
    ranked, specs = _two_ranks(stdlib_small, init)
    group = group_start(ranked, samplers=specs)
    try:
        got = ranked.train(5)
    finally:
        group.finish()
    union = UnionSampler(stdlib_small.train, block_size=CFG.block_size, batch_size=4, seeds=(100, 101))
    one = Learner(learner_id=0, model_cfg=CFG, inner=INNER, fragments=[list(init)], sampler=union, init=init)
    expected = one.train(5)
    # bf16 matmuls on both sides, summed in another order: within 1%, as on the CPU.
    assert all(abs(a - b) <= 0.01 * abs(b) for a, b in zip(got, expected, strict=True)), (got, expected)


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="two NCCL ranks need two GPUs"
)
def test_two_fsdp_nccl_ranks_shard_the_learner_on_the_gpus_and_train_as_one_rank(
    stdlib_small: Corpus,
) -> None:
    from torch.distributed.tensor import DTensor

    from training.engine.distributed import group_start

    init = _init()
    sharded, specs = _two_ranks(stdlib_small, init, device="cpu")  # shards on cuda:0 and cuda:1
    group = group_start(sharded, samplers=specs, sharding="fsdp")
    try:
        got = sharded.train(5)
        p = next(iter(sharded.params.values()))
        assert isinstance(p, DTensor) and p.to_local().device.type == "cuda"
        delta = sharded.make_delta(0).decoded()
    finally:
        group.finish()
    assert sharded.device.type == "cpu" and all(t.device.type == "cpu" for t in delta.values())
    union = UnionSampler(stdlib_small.train, block_size=CFG.block_size, batch_size=4, seeds=(100, 101))
    one = Learner(learner_id=0, model_cfg=CFG, inner=INNER, fragments=[list(init)], sampler=union, init=init)
    expected = one.train(5)
    assert all(abs(a - b) <= 0.01 * abs(b) for a, b in zip(got, expected, strict=True)), (got, expected)
    for name, t in one.make_delta(0).decoded().items():
        torch.testing.assert_close(delta[name], t, atol=5e-3, rtol=5e-2, msg=name)
