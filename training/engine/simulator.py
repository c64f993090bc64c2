"""A deterministic simulator: real compute on a virtual clock.

Every inner step really runs (real forward, backward and AdamW on real bytes), but *when* it
happens is decided by a virtual clock: each learner has its own seconds per step, each
transfer takes ``latency + bytes / bandwidth`` on that learner's up- or down-link, and
failures (a learner gone for an interval, or for good) are injected at given times. Events
at the same virtual time are ordered by kind and then by insertion, so a run is a pure
function of its config and seeds. This is how the benchmark measures stragglers and goodput
on a 2-core machine.

Two modes:

* ``barrier``: classic DiLoCo and Streaming DiLoCo. After pushing a fragment a learner
  waits for its merged version (at once with overlap τ = 0, after τ more steps otherwise,
  then mixes it in with α). With a straggler everybody waits for it.
* ``decoupled``: Decoupled DiLoCo (arXiv 2604.21428). Learners never wait: they push and go
  on, and rebase onto each new version when it lands (or mix it in with α). The syncer merges
  on a quorum. With overlap τ a version that lands within τ steps of the fragment's push is
  held back until the window closes, as the orchestrator does.

Versions travel down as down-deltas (the syncer's compressed difference from the copy the
learners hold, :meth:`Syncer._down`); a rejoining learner downloads the full copy in fp32.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from training.engine.config import (
    CompressionConfig,
    InnerConfig,
    ModelConfig,
    OuterConfig,
    Sharding,
    StreamingConfig,
    SyncerConfig,
)
from training.engine.data import BatchSampler, Corpus, evaluate, shard
from training.engine.fragments import assign_fragments, due, offsets
from training.engine.learner import Adopt, Learner
from training.engine.messages import FragmentDelta, GlobalVersion
from training.engine.model import build_model
from training.engine.syncer import Syncer
from training.engine.transport import Transport

Mode = Literal["barrier", "decoupled"]

# Event kinds, in the order they run when they share a virtual time.
_DELIVER, _ARRIVE, _FAIL, _RECOVER, _REJOIN, _STEP, _POLL = range(7)


@dataclass(frozen=True)
class LearnerSpec:
    step_time: float = 1.0  # virtual seconds per inner step
    batch_size: int = 32
    schedule_steps: int | None = None  # length of this learner's lr schedule
    fail_at: float | None = None
    recover_at: float | None = None  # None with fail_at set: gone for good


@dataclass(frozen=True)
class NetworkConfig:
    bandwidth: float = 10e6  # bytes per virtual second, per learner link and direction
    latency: float = 0.1  # virtual seconds per transfer


@dataclass(frozen=True)
class SimConfig:
    model: ModelConfig
    inner: InnerConfig
    learners: tuple[LearnerSpec, ...]
    h: int
    outer: OuterConfig = OuterConfig()
    streaming: StreamingConfig = StreamingConfig()
    compression: CompressionConfig = CompressionConfig()
    syncer: SyncerConfig | None = None  # None: a barrier over all learners
    network: NetworkConfig = NetworkConfig()
    mode: Mode = "barrier"
    max_steps: int | None = None  # inner steps per learner; None: until time_limit
    time_limit: float | None = None
    sharding: Sharding = "iid"
    eval_every: int = 0  # evaluate the global params after every n-th publish (0: end only)
    seed: int = 0


@dataclass
class SimResult:
    eval_loss: float
    virtual_seconds: float
    real_seconds: float
    tokens_trained: int
    tokens_merged: int  # per fragment, averaged over fragments: each token counts once
    tokens_lost: int
    bytes_up: list[int]
    bytes_down: list[int]
    peak_push_bytes: int  # most bytes one learner pushed at one scheduled sync
    flush_bytes: int  # bytes of the end-of-run flush (all learners), outside the schedule
    publishes: int
    curve: list[dict[str, float]] = field(default_factory=list)  # time, tokens_merged, eval_loss


def time_to_loss(curve: Sequence[Mapping[str, float]], target: float) -> float | None:
    """First time in a run's curve at which the evaluated global loss was <= target.

    Points without an eval loss are skipped. A margin of 1e-9 absorbs float noise: the target is
    often another run's (or this run's own) final loss.
    """
    for point in curve:
        if "eval_loss" in point and point["eval_loss"] <= target + 1e-9:
            return point["time"]
    return None


@dataclass
class _Rt:
    """The simulator's view of one learner."""

    spec: LearnerSpec
    learner: Learner
    gen: int = 0
    alive: bool = True
    done: bool = False
    steps: int = 0
    waiting: dict[int, Adopt] = field(default_factory=dict)  # blocked on these fragments
    due_at: dict[int, int] = field(default_factory=dict)  # overlap: adopt at this step
    up_free: float = 0.0
    down_free: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    peak_push: int = 0
    flush_bytes: int = 0


class Simulator:
    def __init__(
        self,
        cfg: SimConfig,
        corpus: Corpus,
        eval_set: Sequence[tuple[torch.Tensor, torch.Tensor]],
        *,
        device: torch.device | str | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.cfg = cfg
        self.eval_set = eval_set
        m = len(cfg.learners)
        init_model = build_model(cfg.model, seed=cfg.seed)
        init = {n: p.detach().clone() for n, p in init_model.named_parameters()}
        self.fragments = assign_fragments(
            init, fragments=cfg.streaming.fragments, assignment=cfg.streaming.assignment
        )
        self.offsets = offsets(len(self.fragments), cfg.h)
        scfg = cfg.syncer or SyncerConfig(learners=m)
        if scfg.learners != m:
            scfg = replace(scfg, learners=m)
        self.syncer = Syncer(
            cfg=scfg,
            outer=cfg.outer,
            fragments=self.fragments,
            init=init,
            transport=transport,
            down=cfg.compression.down_kind,
        )
        self.eval_model = init_model.to(device or "cpu")
        self.rts: list[_Rt] = []
        for i, spec in enumerate(cfg.learners):
            inner = cfg.inner
            if spec.schedule_steps is not None:
                inner = replace(inner, total_steps=spec.schedule_steps)
            sampler = BatchSampler(
                shard(corpus.train, index=i, count=m, sharding=cfg.sharding),
                block_size=cfg.model.block_size,
                batch_size=spec.batch_size,
                seed=cfg.seed * 1000 + i + 1,
            )
            learner = Learner(
                learner_id=i,
                model_cfg=cfg.model,
                inner=inner,
                fragments=self.fragments,
                sampler=sampler,
                init=init,
                compression=cfg.compression,
                device=device,
            )
            self.rts.append(_Rt(spec=spec, learner=learner))
        self._heap: list[tuple[float, int, int, int, Any]] = []
        self._seq = 0
        self.now = 0.0
        self.tokens_merged = 0
        self._merged_by_fragment = [0] * len(self.fragments)
        self.tokens_lost = 0
        self.publishes = 0
        self.last_publish = 0.0
        self.curve: list[dict[str, float]] = []

    # ---- event plumbing -----------------------------------------------------------------
    def _at(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, kind, payload))

    def _schedule_step(self, i: int) -> None:
        rt = self.rts[i]
        end = self.now + rt.spec.step_time
        if self.cfg.time_limit is not None and end > self.cfg.time_limit:
            rt.done = True
            return
        self._at(end, _STEP, (i, rt.gen))

    # ---- the run ------------------------------------------------------------------------
    def run(self) -> SimResult:
        start = time.perf_counter()
        for i, rt in enumerate(self.rts):
            self._schedule_step(i)
            if rt.spec.fail_at is not None:
                self._at(rt.spec.fail_at, _FAIL, i)
                if rt.spec.recover_at is not None:
                    self._at(rt.spec.recover_at, _RECOVER, i)
        while self._heap:
            t, _, _, kind, payload = heapq.heappop(self._heap)
            if self.cfg.time_limit is not None and t > self.cfg.time_limit:
                break
            self.now = t
            if kind == _STEP:
                self._on_step(*payload)
            elif kind == _ARRIVE:
                self.syncer.submit(payload, t)
                self._poll()
            elif kind == _POLL:
                self._poll()
            elif kind == _DELIVER:
                self._on_deliver(*payload)
            elif kind == _FAIL:
                self._on_fail(payload)
            elif kind == _RECOVER:
                self._on_recover(payload)
            elif kind == _REJOIN:
                self._on_rejoin(*payload)
        loss = self._evaluate()
        end_time = self.cfg.time_limit if self.cfg.time_limit is not None else self.last_publish
        self.curve.append({"time": end_time, "tokens_merged": float(self.tokens_merged), "eval_loss": loss})
        return SimResult(
            eval_loss=loss,
            virtual_seconds=end_time,
            real_seconds=time.perf_counter() - start,
            tokens_trained=sum(rt.learner.total_tokens for rt in self.rts),
            tokens_merged=self.tokens_merged,
            tokens_lost=self.tokens_lost,
            bytes_up=[rt.bytes_up for rt in self.rts],
            bytes_down=[rt.bytes_down for rt in self.rts],
            peak_push_bytes=max(rt.peak_push for rt in self.rts),
            flush_bytes=sum(rt.flush_bytes for rt in self.rts),
            publishes=self.publishes,
            curve=self.curve,
        )

    def _evaluate(self) -> float:
        with torch.no_grad():
            for n, p in self.eval_model.named_parameters():
                p.copy_(self.syncer.params[n])
        return evaluate(self.eval_model, self.eval_set)

    # ---- learners -----------------------------------------------------------------------
    def _on_step(self, i: int, gen: int) -> None:
        rt = self.rts[i]
        if gen != rt.gen or not rt.alive:
            return
        rt.learner.train_step()
        rt.steps += 1
        barrier = self.cfg.mode == "barrier"
        # Overlap τ > 0: the fragment pushed τ steps ago is mixed in now if its version has
        # arrived; otherwise a barrier learner waits for it and a decoupled one adopts it on arrival.
        for f, at in list(rt.due_at.items()):
            if at <= rt.steps:
                del rt.due_at[f]
                if rt.learner.held_version[f] > rt.learner.base_version[f]:
                    rt.learner.adopt_held(f, how=self._overlap_how(), alpha=self.cfg.streaming.alpha)
                elif barrier:
                    rt.waiting[f] = "mix"
        final = self.cfg.max_steps is not None and rt.steps >= self.cfg.max_steps
        to_push = due(rt.steps, h=self.cfg.h, fragment_offsets=self.offsets)
        if final:  # flush whatever is not synced yet, so the global params hold all work
            to_push = [
                f for f in range(len(self.fragments)) if f in to_push or rt.learner.pending_steps[f] > 0
            ]
        scheduled = due(rt.steps, h=self.cfg.h, fragment_offsets=self.offsets)
        pushed = 0
        for f in to_push:
            delta = rt.learner.make_delta(f, now=self.now)
            nbytes = self._upload(rt, delta)
            if f in scheduled:  # the end-of-run flush is not part of the sync schedule
                pushed += nbytes
            else:
                rt.flush_bytes += nbytes
            if barrier:
                tau = self.cfg.streaming.overlap
                if tau == 0 or final:
                    rt.waiting[f] = "replace"
                else:
                    rt.due_at[f] = rt.steps + tau
        rt.peak_push = max(rt.peak_push, pushed)
        if final:
            rt.done = True
        elif not rt.waiting:
            self._schedule_step(i)

    def _upload(self, rt: _Rt, delta: FragmentDelta) -> int:
        net = self.cfg.network
        nbytes = delta.nbytes
        start = max(self.now, rt.up_free)
        rt.up_free = start + nbytes / net.bandwidth
        rt.bytes_up += nbytes
        self._at(rt.up_free + net.latency, _ARRIVE, delta)
        return nbytes

    def _on_deliver(self, i: int, gen: int, snap: GlobalVersion) -> None:
        rt = self.rts[i]
        if gen != rt.gen or not rt.alive:
            return
        f = snap.fragment
        learner = rt.learner
        if snap.version <= learner.held_version[f]:
            return
        if snap.down and snap.version == learner.held_version[f] + 1:
            learner.receive(snap.down_delta())
        else:
            learner.receive_full(f, snap.held, snap.version)
        alpha = self.cfg.streaming.alpha
        if self.cfg.mode == "decoupled":
            tau = self.cfg.streaming.overlap
            if learner.may_adopt(f, tau):
                learner.adopt_held(f, how=self._overlap_how(), alpha=alpha)
            else:  # adopted when the overlap window closes
                at = learner.pushed_at[f]
                rt.due_at[f] = (at if at is not None else 0) + tau
            return
        if f in rt.waiting:
            how = rt.waiting.pop(f)
            learner.adopt_held(f, how=how, alpha=alpha)
            if not rt.waiting and not rt.done:
                self._schedule_step(i)
        elif f not in rt.due_at:  # (inside the window it is mixed in when the window closes)
            learner.adopt_held(f, how="replace")

    def _overlap_how(self) -> Adopt:
        """How a version is taken when its overlap window closes: Streaming DiLoCo mixes with
        α in barrier mode; a decoupled learner rebases (keeps its steps) unless α is set."""
        if self.cfg.mode == "barrier" or self.cfg.streaming.alpha > 0:
            return "mix"
        return "rebase"

    def _on_fail(self, i: int) -> None:
        rt = self.rts[i]
        rt.alive = False
        rt.gen += 1  # cancels its scheduled step and any delivery in flight
        rt.waiting.clear()
        rt.due_at.clear()
        self.tokens_lost += max(rt.learner.pending_tokens, default=0)

    def _on_recover(self, i: int) -> None:
        rt = self.rts[i]
        # A rejoining learner downloads the newest global state of every fragment first.
        net = self.cfg.network
        size = sum(t.numel() * 4 for t in self.syncer.params.values())
        start = max(self.now, rt.down_free)
        rt.down_free = start + size / net.bandwidth
        rt.bytes_down += size
        self._at(rt.down_free + net.latency, _REJOIN, (i, rt.gen))

    def _on_rejoin(self, i: int, gen: int) -> None:
        rt = self.rts[i]
        if gen != rt.gen:
            return
        rt.learner.rejoin(self.syncer.mirror, self.syncer.version)
        rt.alive = True
        rt.done = False
        self._schedule_step(i)

    # ---- syncer -------------------------------------------------------------------------
    def _poll(self) -> None:
        for snap in self.syncer.poll(self.now):
            self.publishes += 1
            self.last_publish = self.now
            self._merged_by_fragment[snap.fragment] += int(snap.meta.get("tokens", 0))
            self.tokens_merged = sum(self._merged_by_fragment) // len(self.fragments)
            point = {"time": self.now, "tokens_merged": float(self.tokens_merged)}
            if self.cfg.eval_every and self.publishes % self.cfg.eval_every == 0:
                point["eval_loss"] = self._evaluate()
            self.curve.append(point)
            net = self.cfg.network
            # Learners hold version − 1 of the mirror: they download the down-delta only.
            size = snap.down_delta().nbytes if snap.down else snap.nbytes
            for i, rt in enumerate(self.rts):
                if not rt.alive:
                    continue
                start = max(self.now, rt.down_free)
                rt.down_free = start + size / net.bandwidth
                rt.bytes_down += size
                self._at(rt.down_free + net.latency, _DELIVER, (i, rt.gen, snap))
        deadline = self.syncer.next_deadline()
        if deadline is not None and deadline > self.now:
            self._at(deadline, _POLL, None)


@dataclass
class DataParallelResult:
    eval_loss: float
    real_seconds: float
    tokens: int
    steps: int


def train_data_parallel(
    *,
    model_cfg: ModelConfig,
    inner: InnerConfig,
    corpus: Corpus,
    eval_set: Sequence[tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    steps: int,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> DataParallelResult:
    """The data-parallel baseline. M workers with batch B/M each, averaging gradients every
    step, take exactly the steps of one worker with batch B, so that is what runs here (with
    the very same learner code, which never syncs)."""
    start = time.perf_counter()
    init_model = build_model(model_cfg, seed=seed)
    init = {n: p.detach().clone() for n, p in init_model.named_parameters()}
    sampler = BatchSampler(
        corpus.train, block_size=model_cfg.block_size, batch_size=batch_size, seed=seed * 1000 + 1
    )
    learner = Learner(
        learner_id=0,
        model_cfg=model_cfg,
        inner=inner,
        fragments=[list(init)],
        sampler=sampler,
        init=init,
        device=device,
    )
    learner.train(steps)
    loss = evaluate(learner.model, eval_set)
    return DataParallelResult(
        eval_loss=loss, real_seconds=time.perf_counter() - start, tokens=learner.total_tokens, steps=steps
    )
