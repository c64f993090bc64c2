"""A learner as a sharded process group (``learners.sharding: fsdp``): 2 gloo ranks under FSDP2
hold half of the parameters and of the AdamW state each, and train, push Δ and adopt global
versions as 1 rank does with the same global batch; the state gathered at the session's end
checkpoints and resumes exactly, and a kept group goes on as a fresh one would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from storage.tensorblob import pack, unpack
from tests.training.engine.rank_samplers import SamplerSpec, UnionSampler, bytes_spec
from training.engine.config import InnerConfig, ModelConfig
from training.engine.data import BatchSampler, Corpus
from training.engine.distributed import group_release, group_start, kept_group
from training.engine.distributed.sharding import local_numel
from training.engine.learner import Learner
from training.engine.model import build_model

# Two blocks (each its own FSDP unit) and a position table of 15 rows: a shard of uneven size.
CFG = ModelConfig(n_layer=2, n_embd=32, n_head=2, block_size=15)
INNER = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=20, batch_size=8)
HALF = 4  # windows per rank


def _init() -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in build_model(CFG, seed=5).named_parameters()}


def _spec(data: torch.Tensor, rank: int) -> SamplerSpec:
    return bytes_spec(data, block_size=CFG.block_size, batch_size=HALF, seed=200 + rank)


def _union(data: torch.Tensor) -> UnionSampler:
    """One rank drawing what ranks 0 and 1 draw together: the same global batch of 8."""
    return UnionSampler(data, block_size=CFG.block_size, batch_size=HALF, seeds=(200, 201))


def _learner(sampler: object, *, ranks: int, init: dict[str, torch.Tensor]) -> Learner:
    names = list(init)
    return Learner(
        learner_id=0,
        model_cfg=CFG,
        inner=INNER,
        fragments=[names[::2], names[1::2]],  # two fragments: each push and adoption a subset
        sampler=sampler,  # type: ignore[arg-type]
        init=init,
        device="cpu",
        ranks=ranks,
    )


def _sharded(data: torch.Tensor, init: dict[str, torch.Tensor]) -> Learner:
    return _learner(
        BatchSampler(data, block_size=CFG.block_size, batch_size=HALF, seed=200), ranks=2, init=init
    )


def _script(
    learner: Learner, shifted: dict[str, torch.Tensor]
) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    """The outer-step traffic of a chunk: steps, a push, an adoption by rebase, more steps, a
    push of the other fragment, an adoption by mix, a last step. Returns (losses, the Δs)."""
    losses = learner.train(3)
    deltas = [learner.make_delta(0).decoded()]
    learner.adopt(0, shifted, 1, how="rebase")
    losses += learner.train(2)
    deltas.append(learner.make_delta(1).decoded())
    learner.adopt(1, shifted, 1, how="mix", alpha=0.25)
    losses += learner.train(1)
    return losses, deltas


def _assert_same_state(got: Learner, want: Learner) -> None:
    g_meta, g = got.state_dict()
    w_meta, w = want.state_dict()
    assert g_meta["step_count"] == w_meta["step_count"] and g_meta["opt_keys"] == w_meta["opt_keys"]
    for key, t in w.items():
        if key.startswith(("param:", "anchor:", "held:", "opt:")):
            torch.testing.assert_close(g[key], t, atol=2e-4, rtol=1e-3, msg=key)


@pytest.fixture
def no_kept_group() -> Iterator[None]:
    yield
    group_release()
    assert kept_group() is None and not dist.is_initialized()


def test_two_fsdp_ranks_hold_half_the_state_and_train_push_and_adopt_as_one_rank_does(
    stdlib_small: Corpus,
) -> None:
    data, init = stdlib_small.train, _init()
    shifted = {n: t + 0.01 for n, t in init.items()}  # a "global version"
    one = _learner(_union(data), ranks=1, init=init)
    expected = one.train(1)
    more, want_deltas = _script(one, shifted)
    expected += more

    two = _sharded(data, init)
    whole = local_numel(two)
    group = group_start(two, samplers=[_spec(data, 1)], sharding="fsdp")
    try:
        got = two.train(1)
        # While the session runs, rank 0 holds its shard of every parameter and of AdamW's
        # moments: half of the model (a shard of 15 rows is 8 on rank 0).
        assert two.sharded is not None and local_numel(two) <= whole // 2 + CFG.n_embd
        moments = [st["exp_avg"] for st in two.opt.state.values()]
        assert moments and all(isinstance(m, DTensor) for m in moments)
        assert sum(m.to_local().numel() for m in moments) == local_numel(two)
        losses, got_deltas = _script(two, shifted)
        got += losses
    finally:
        group.finish()
    assert two.sharded is None and two.group is None and two.net is two.model  # whole again
    assert all(p.poll() == 0 for p in group.procs) and not dist.is_initialized()

    assert all(abs(a - b) <= 0.01 * abs(b) for a, b in zip(got, expected, strict=True)), (got, expected)
    for got_d, want_d in zip(got_deltas, want_deltas, strict=True):
        assert set(got_d) == set(want_d)
        for name, t in want_d.items():
            torch.testing.assert_close(got_d[name], t, atol=2e-4, rtol=1e-3, msg=name)
    _assert_same_state(two, one)
    assert two.base_version == one.base_version == [1, 1]

    # The gathered state is a whole checkpoint: restored in a new learner, a second sharded
    # session goes on exactly as the one rank does.
    again = _sharded(data, init)
    again.load_state_dict(*unpack(pack(*two.state_dict())))
    again.rank_samplers = dict(two.rank_samplers)
    group = group_start(again, samplers=[_spec(data, 1)], sharding="fsdp")
    try:
        got = again.train(2)
    finally:
        group.finish()
    expected = one.train(2)
    assert all(abs(a - b) <= 0.01 * abs(b) for a, b in zip(got, expected, strict=True)), (got, expected)
    _assert_same_state(again, one)


def test_a_kept_fsdp_group_goes_on_with_its_sharded_replica_as_a_fresh_group_would(
    stdlib_small: Corpus, no_kept_group: None
) -> None:
    data, init = stdlib_small.train, _init()
    fresh, kept_learner = _sharded(data, init), _sharded(data, init)
    results = []
    for learner, key in ((fresh, None), (kept_learner, "learner-0")):
        losses, pids, flags = [], [], []
        for _ in range(2):
            group = group_start(learner, samplers=[_spec(data, 1)], key=key, sharding="fsdp")
            try:
                losses += learner.train(2)
                learner.make_delta(0)
            finally:
                group.finish()
            pids.append(group.pids[0])
            flags.append((group.kept, group.continued))
        results.append((losses, pids, flags))
    (want, fresh_pids, _), (got, kept_pids, flags) = results
    assert fresh_pids[0] != fresh_pids[1]
    assert flags == [(False, False), (True, True)] and kept_pids[0] == kept_pids[1]
    assert got == want, (got, want)  # bit for bit: the same shards, the same steps
    _assert_same_state(kept_learner, fresh)
    # A DDP session for the same key is another group: the FSDP helper leaves.
    group = group_start(_sharded(data, init), samplers=[_spec(data, 1)], key="learner-0")
    try:
        assert not group.kept and not group.group.sharded
    finally:
        group.finish()
