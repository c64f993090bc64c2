"""A learner as a process group: 2 gloo ranks train as 1 rank with the same global batch, keep
every rank's sampler position across a checkpoint, and a rank that fails fails the group cleanly.
A keyed group lives between sessions: the same helpers train on, exactly as a fresh group would,
and it ends when another key needs the process, when released, when idle, or when it broke."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from storage.tensorblob import pack, unpack
from tests.training.engine.rank_samplers import SamplerSpec, UnionSampler, bytes_spec
from training.engine.config import InnerConfig, ModelConfig
from training.engine.data import BatchSampler, Corpus, eval_batches, evaluate
from training.engine.distributed import (
    RankError,
    group_release,
    group_start,
    helper_learner,
    kept_group,
    replica_blob,
)
from training.engine.distributed.group import END
from training.engine.distributed.helper import _next_word
from training.engine.distributed.leader import _GROUP_LOCK
from training.engine.learner import Learner
from training.engine.model import build_model, make_model

CFG = ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=16)
INNER = InnerConfig(lr=3e-3, warmup_steps=2, total_steps=20, batch_size=8)
HALF = 4  # windows per rank


def _init() -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in build_model(CFG, seed=3).named_parameters()}


def _spec(data: torch.Tensor, rank: int) -> SamplerSpec:
    return bytes_spec(data, block_size=CFG.block_size, batch_size=HALF, seed=100 + rank)


def _union(data: torch.Tensor) -> UnionSampler:
    """One rank drawing what ranks 0 and 1 draw together: the same global batch of 8."""
    return UnionSampler(data, block_size=CFG.block_size, batch_size=HALF, seeds=(100, 101))


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
    one = _learner(_union(data), ranks=1, init=init)
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
    # A group started without a key ends with its session: the helper has left.
    assert all(p.poll() == 0 for p in group.procs) and not dist.is_initialized()
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
    rank1 = helper_learner(replica_blob(again, rank=1, sampler=_spec(data, 1)), torch.device("cpu"))
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
    rank1 = helper_learner(replica_blob(again, rank=1, sampler=_spec(data, 1)), torch.device("cpu"))
    assert (rank1.windows, rank1.step_count) == (2, 4)
    x0, _ = again.sampler.next()
    x1, _ = rank1.sampler.next()
    x, _ = _union_after(data, steps=6).next()
    assert torch.equal(x0, x[:HALF]) and torch.equal(x1, x[HALF:])


def _union_after(data: torch.Tensor, *, steps: int) -> UnionSampler:
    """The one-rank sampler after ``steps`` batches."""
    union = _union(data)
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


@pytest.fixture
def no_kept_group() -> object:
    yield
    group_release()  # whatever a test kept, the next test starts without it
    assert kept_group() is None and not dist.is_initialized()


def _session(learner: Learner, data: torch.Tensor, steps: int, *, key: object = None, **kw: object) -> tuple:
    """One session of ``steps`` inner steps; (its losses, whether the group was kept, whether
    the helper went on with its replica, the helper's pid)."""
    group = group_start(learner, samplers=[_spec(data, 1)], key=key, **kw)  # type: ignore[arg-type]
    try:
        losses = learner.train(steps)
    finally:
        group.finish()
    return losses, group.kept, group.continued, group.pids[0]


def _exited(pid: int) -> Callable[[], bool]:
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A child of this process that exited stays a zombie until it is reaped.
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] == "Z"

    return gone


def _until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_kept_group_trains_its_next_sessions_with_the_same_helper_as_a_fresh_group_would(
    stdlib_small: Corpus, no_kept_group: object
) -> None:
    data, init = stdlib_small.train, _init()
    # The reference: a group started afresh for each session (the replica sent whole each time).
    fresh = _ranked(data, init)
    expected, _, _, first = _session(fresh, data, 3)
    more, kept, _, second = _session(fresh, data, 3)
    assert not kept and second != first
    expected += more

    kept_learner = _ranked(data, init)
    got, kept, went_on, pid = _session(kept_learner, data, 3, key="learner-0")
    assert not kept and not went_on and kept_group() is not None and dist.is_initialized()
    more, kept, went_on, again = _session(kept_learner, data, 3, key="learner-0")
    assert kept and went_on and again == pid  # no new process, no new rendezvous
    got += more
    assert got == expected, (got, expected)  # bit for bit: the same batches, the same steps
    for name, p in fresh.params.items():
        assert torch.equal(kept_learner.params[name], p), name
    assert kept_learner.rank_samplers[1].tolist() == fresh.rank_samplers[1].tolist()

    # A learner restored elsewhere (another object: a checkpoint) is sent whole to the same helper.
    restored = _ranked(data, init)
    restored.load_state_dict(*unpack(pack(*kept_learner.state_dict())))
    _, kept, went_on, same = _session(restored, data, 1, key="learner-0")
    assert kept and not went_on and same == pid

    # Another key (another learner, or this one re-placed) needs the process: the old helper leaves.
    _, kept, _, other = _session(_ranked(data, init), data, 1, key="learner-1")
    assert not kept and other != pid
    _until(_exited(pid))
    assert group_release(lambda key: key == "learner-0") is False  # not the group kept now
    assert group_release(lambda key: key == "learner-1") is True
    _until(_exited(other))


def test_a_kept_group_whose_helper_died_between_sessions_is_started_again_for_the_next(
    stdlib_small: Corpus, no_kept_group: object
) -> None:
    data, init = stdlib_small.train, _init()
    learner = _ranked(data, init)
    _, _, _, pid = _session(learner, data, 2, key="k")
    os.kill(pid, signal.SIGKILL)
    _until(_exited(pid))
    losses, kept, went_on, new = _session(learner, data, 2, key="k")
    assert not kept and not went_on and new != pid and len(losses) == 2
    assert learner.step_count == 4 and set(learner.rank_samplers) == {1}


def test_a_kept_group_ends_by_itself_when_no_session_comes(
    stdlib_small: Corpus, no_kept_group: object
) -> None:
    data, init = stdlib_small.train, _init()
    _, _, _, pid = _session(_ranked(data, init), data, 1, key="k", idle_s=2.0)
    assert kept_group() is not None
    _until(lambda: kept_group() is None)  # rank 0's timer, at idle_s / 2, ends it
    _until(_exited(pid))
    _until(lambda: not dist.is_initialized())  # and leaves the process group, on its thread
    assert not _GROUP_LOCK.locked()


def test_a_waiting_helper_leaves_when_its_parent_or_its_store_is_gone() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    started = time.monotonic()
    assert _next_word(store, 0, idle_s=0.3, parent=os.getppid()) == END  # nothing came: idle
    assert time.monotonic() - started >= 0.3
    assert _next_word(store, 0, idle_s=60, parent=-1) == END  # not its parent any more
    store.set("go/0", "load")
    assert _next_word(store, 0, idle_s=60, parent=os.getppid()) == b"load"
    # A helper whose rank 0 was killed: its store is gone, it leaves (exit code 0) at once.
    # "rank 0" prints its store's port, then "connected" once the helper's client is in (or
    # "nobody" after two minutes, so that a helper that cannot start fails the test, not hangs it).
    script = (
        "import time, torch.distributed as d\n"
        "s = d.TCPStore('127.0.0.1', 0, 2, True, wait_for_workers=False)\n"
        "print(s.port, flush=True)\n"
        "deadline = time.monotonic() + 120\n"
        "while s.num_keys() == 0 and time.monotonic() < deadline: time.sleep(0.05)\n"
        "print('connected' if s.num_keys() else 'nobody', flush=True)\n"
        "time.sleep(120)\n"
    )
    rank0 = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)  # noqa: S603
    helper = None
    try:
        assert rank0.stdout is not None
        port = int(rank0.stdout.readline())
        helper = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "training.engine.distributed.helper", "--rank", "1", "--world", "2"]
            + ["--port", str(port), "--idle", "120"],
        )
        assert rank0.stdout.readline().strip() == b"connected"
        assert helper.poll() is None  # waiting for session 0
        rank0.kill()
        assert helper.wait(timeout=60) == 0
    finally:
        for proc in (rank0, helper):
            if proc is not None:
                proc.kill()
                proc.wait()
