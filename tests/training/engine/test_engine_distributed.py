"""A learner as a process group: 2 gloo ranks train as 1 rank with the same global batch, keep
every rank's sampler position across a checkpoint, and a rank that fails fails the group cleanly."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from storage.tensorblob import pack, unpack
from training.engine.config import InnerConfig, ModelConfig
from training.engine.data import BatchSampler, Corpus, eval_batches, evaluate
from training.engine.distributed import _GROUP_LOCK, RankError, _helper_learner, group_start, replica_blob
from training.engine.learner import Learner
from training.engine.model import build_model, make_model

CFG = ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=16)
INNER = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=20, batch_size=8)
HALF = 4  # windows per rank


def _init() -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in build_model(CFG, seed=3).named_parameters()}


def _spec(data: torch.Tensor, rank: int) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    return {"kind": "bytes", "block_size": CFG.block_size, "batch_size": HALF, "seed": 100 + rank}, {
        "data": data
    }


class _Union:
    """One rank drawing what ranks 0 and 1 draw together: the same global batch of 8."""

    batch_size, block_size = 2 * HALF, CFG.block_size

    def __init__(self, data: torch.Tensor) -> None:
        self.parts = [
            BatchSampler(data, block_size=CFG.block_size, batch_size=HALF, seed=100 + r) for r in (0, 1)
        ]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*(p.next() for p in self.parts), strict=True)
        return torch.cat(xs), torch.cat(ys)


def _learner(sampler: object, *, ranks: int, init: dict[str, torch.Tensor]) -> Learner:
    return Learner(
        learner_id=0,
        model_cfg=CFG,
        inner=INNER,
        fragments=[list(init)],
        sampler=sampler,  # type: ignore[arg-type]
        init=init,
        device="cpu",
        ranks=ranks,
    )


def _eval(learner: Learner, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    model = make_model(CFG)
    model.load_state_dict({n: p.detach() for n, p in learner.params.items()})
    return evaluate(model, batches)


def _close(a: list[float], b: list[float], rel: float = 0.01) -> bool:
    return all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b, strict=True))


def _batches(corpus: Corpus) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return eval_batches(corpus.eval, block_size=CFG.block_size, windows=32)


def _ranked(data: torch.Tensor, init: dict[str, torch.Tensor]) -> Learner:
    return _learner(
        BatchSampler(data, block_size=CFG.block_size, batch_size=HALF, seed=100), ranks=2, init=init
    )


def test_two_gloo_ranks_give_the_loss_of_one_rank_at_the_same_global_batch_through_an_adoption_and_a_checkpoint(
    stdlib_small: Corpus,
) -> None:
    data, init = stdlib_small.train, _init()
    one = _learner(_Union(data), ranks=1, init=init)
    two = _ranked(data, init)
    assert two.tokens_per_step == one.tokens_per_step == 8 * CFG.block_size
    shifted = {n: t + 0.01 for n, t in init.items()}  # a "global version" adopted mid-chunk
    expected = one.train(3)
    one.adopt(0, shifted, 1, how="rebase")
    expected += one.train(1)

    group = group_start(two, samplers=[_spec(data, 1)])
    try:
        got = two.train(3)
        two.adopt(0, shifted, 1, how="rebase")  # rank 0 alone adopts; rank 1 gets it by broadcast
        got += two.train(1)
    finally:
        group.finish()
    assert two.group is None and two.net is two.model  # unwrapped again
    assert set(two.rank_samplers) == {1}
    meta, tensors = two.state_dict()
    assert "sampler@1" in tensors and "sampler" in tensors

    for name, p in one.params.items():
        torch.testing.assert_close(two.params[name], p, atol=1e-4, rtol=1e-3)
    eval_set = _batches(stdlib_small)
    assert abs(_eval(two, eval_set) - _eval(one, eval_set)) <= 0.01 * _eval(one, eval_set)
    assert _close(got, expected), (got, expected)

    # The checkpoint, restored in another process, tells a new rank 1 where its stream stood:
    # its next batch is the one rank 1 of the uninterrupted run (the union's second half) draws.
    again = _ranked(data, init)
    again.load_state_dict(*unpack(pack(meta, tensors)))
    rank1 = _helper_learner(replica_blob(again, rank=1, sampler=_spec(data, 1)), torch.device("cpu"))
    assert rank1.step_count == again.step_count == 4
    x1, _ = rank1.sampler.next()
    x, _ = _union_after(data, steps=4).next()
    assert torch.equal(x1, x[HALF:])
    for name, p in again.params.items():
        torch.testing.assert_close(rank1.params[name], p)
    assert rank1.opt.state_dict()["state"][0]["exp_avg"].abs().sum() > 0  # AdamW moments came along

    # Windows skipped on rank 0 (a dead chunk had pushed them) are skipped by rank 1 as it
    # starts: its next batch is the one after them, and the lr schedule does not move.
    again = _ranked(data, init)
    again.load_state_dict(*unpack(pack(meta, tensors)))
    again.skip_windows(2)
    assert (again.windows, again.step_count) == (4 + 2, 4)
    rank1 = _helper_learner(replica_blob(again, rank=1, sampler=_spec(data, 1)), torch.device("cpu"))
    assert (rank1.windows, rank1.step_count) == (2, 4)
    x0, _ = again.sampler.next()
    x1, _ = rank1.sampler.next()
    x, _ = _union_after(data, steps=6).next()
    assert torch.equal(x0, x[:HALF]) and torch.equal(x1, x[HALF:])


def _union_after(data: torch.Tensor, *, steps: int) -> _Union:
    """The one-rank sampler after ``steps`` batches."""
    union = _Union(data)
    for _ in range(steps):
        union.next()
    return union


def test_a_rank_that_cannot_start_fails_the_group_with_its_reason_and_frees_the_process(
    stdlib_small: Corpus,
) -> None:
    init = _init()
    learner = _learner(
        BatchSampler(stdlib_small.train, block_size=CFG.block_size, batch_size=HALF, seed=1),
        ranks=2,
        init=init,
    )
    broken: tuple[dict[str, object], dict[str, torch.Tensor]] = (
        {"kind": "bytes", "block_size": CFG.block_size, "batch_size": HALF, "seed": 1},
        {},
    )  # no data
    with pytest.raises(RankError, match="rank 1 exited with 1: .*KeyError: 'data'"):
        group_start(learner, samplers=[broken])
    # The process may start another group at once: the lock and the default group are released.
    assert learner.group is None and not _GROUP_LOCK.locked() and not dist.is_initialized()
