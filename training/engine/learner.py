"""A DiLoCo learner: inner AdamW steps from a global version, then Δ per fragment.

One learner owns a model replica, its own inner optimizer state (kept across rounds, as in
arXiv 2311.08105 Algorithm 1) and a data sampler. For each fragment it remembers an *anchor*:
the global parameters it last adopted, or its own parameters at its last push. The outer
gradient it sends is Δ = anchor − θ_local (arXiv 2311.08105 eq. 1: θ_global − θ_local when
the anchor is the global version), tagged with the base version, steps and tokens behind it.

Adopting a newly published fragment can

* ``replace`` the local fragment (DiLoCo, and Streaming DiLoCo without overlap),
* ``mix`` it, θ = α·θ_local + (1 − α)·θ_global (Streaming DiLoCo with overlap τ, arXiv
  2501.18512 sec. 2.3),
* ``rebase`` onto it, θ = θ_global + (θ_local − anchor): keep the progress made since the
  last push. Decoupled learners (arXiv 2604.21428) never wait for the syncer, so the version
  usually arrives a few steps after the push; rebasing keeps those steps without counting
  them twice (they are in the next Δ, not in the last).

The learner also keeps ``held``, its copy of the global parameters, which the syncer's
down-deltas move from one version to the next (:meth:`Learner.receive`); a learner that has
no copy takes a full version (:meth:`Learner.receive_full`). Receiving and adopting are
separate so that a version can arrive during the overlap window τ and be adopted when the
window closes (:meth:`Learner.may_adopt`).

:meth:`Learner.state_dict` and :meth:`Learner.load_state_dict` carry everything that decides
the learner's next steps (parameters, anchors, held copy, AdamW moments and step counts, lr
schedule position, pending steps and tokens, push counter, error-feedback residuals and the
sampler's generator), so a learner restored in another process continues bit for bit.

A learner may be a process group of ``ranks`` processes (training.engine.distributed): each
rank draws ``batch / ranks`` windows, ``net`` is the DistributedDataParallel wrapper of
``model`` and ``group`` broadcasts rank 0's parameters after it adopted a version. The
learner's other ranks' sampler positions are kept in ``rank_samplers`` and checkpointed. In a
sharded group (FSDP2), ``net`` is the sharded module and, while its session runs, ``params``,
``anchor`` and ``opt`` hold this rank's shards (training.engine.distributed.sharding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any, Literal

import torch

from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, InnerConfig
from training.engine.data import Sampler
from training.engine.messages import DownDelta, FragmentDelta
from training.engine.model import AnyModelConfig, make_model

Adopt = Literal["replace", "mix", "rebase"]


def lr_at(step: int, cfg: InnerConfig) -> float:
    """Linear warmup, then cosine decay to ``lr * min_lr_ratio`` (or constant)."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def apply_adoption(p: torch.Tensor, g: torch.Tensor, anchor: torch.Tensor, how: Adopt, alpha: float) -> None:
    """θ takes the global ``g`` (in place): replace, mix (α·θ + (1 − α)·g) or rebase (g + θ − anchor)."""
    if how == "replace":
        p.copy_(g)
    elif how == "mix":
        p.mul_(alpha).add_(g, alpha=1.0 - alpha)
    else:  # rebase: keep the progress since the last push on top of the new global
        p.add_(g - anchor)


def make_inner_optimizer(params: Sequence[torch.nn.Parameter], cfg: InnerConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Learner:
    """Runs inner steps and produces fragment deltas; see the module docstring."""

    def __init__(
        self,
        *,
        learner_id: int,
        model_cfg: AnyModelConfig,
        inner: InnerConfig,
        fragments: list[list[str]],
        sampler: Sampler,
        init: Mapping[str, torch.Tensor],
        versions: Sequence[int] | None = None,
        compression: CompressionConfig | None = None,
        device: torch.device | str | None = None,
        ranks: int = 1,
    ) -> None:
        self.id = learner_id
        self.model_cfg = model_cfg
        self.inner = inner
        self.fragments = fragments
        self.sampler = sampler
        self.device = torch.device(device) if device is not None else default_device()
        self.model = make_model(model_cfg).to(self.device)
        self.params = dict(self.model.named_parameters())
        # What the forward pass goes through: the model, or its DDP wrapper while the learner
        # trains as a process group (then `group` is its training.engine.distributed.RankGroup).
        self.net: torch.nn.Module = self.model
        self.group: Any = None
        # While a sharded group's session runs (training.engine.distributed.sharding): the host
        # state it replaced. Then `params`, `anchor` and `opt` are this rank's shards.
        self.sharded: Any = None
        self.ranks = ranks
        self.params_changed = False  # adopted since the group's last step (rank 0 broadcasts)
        self.rank_samplers: dict[int, torch.Tensor] = {}  # rank -> its sampler's saved position
        self.compressor = Compressor(compression or CompressionConfig())
        self.step_count = 0  # position in the inner lr schedule
        # Batches this rank has drawn from its sampler: the windows trained, plus those skipped
        # because a chunk that died had already pushed them (skip_windows). A delta records it, so
        # a learner restored from an older checkpoint knows which windows reached the syncer.
        self.windows = 0
        self.rank_skip = 0  # windows ranks 1..N-1 skip when they next start (replica_blob)
        self.seq = 0
        self.tokens_per_step = sampler.batch_size * sampler.block_size * ranks  # all ranks' windows
        self.total_tokens = 0
        self._load(init, versions)

    def _load(self, init: Mapping[str, torch.Tensor], versions: Sequence[int] | None) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(init[name])
        self.anchor = {n: p.detach().float().clone() for n, p in self.params.items()}
        self.base_version = list(versions) if versions is not None else [0] * len(self.fragments)
        # The learner's copy of the global parameters (fp32, CPU: the syncer's mirror, bitwise)
        # and the version of it per fragment; ahead of base_version while a received version
        # waits for the overlap window to close.
        self.held = {n: init[n].detach().float().cpu().clone() for n in self.params}
        self.held_version = list(self.base_version)
        self.pushed_at: list[int | None] = [None] * len(self.fragments)  # step of the last push
        self.pending_steps = [0] * len(self.fragments)
        self.pending_tokens = [0] * len(self.fragments)
        self.opt = make_inner_optimizer(list(self.params.values()), self.inner)
        self.compressor.reset()

    def _autocast(self) -> torch.autocast | nullcontext[None]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def train_step(self) -> float:
        """One inner step; returns the training loss (the mean over the ranks of a group)."""
        if self.group is not None:
            self.group.sync(self)  # rank 0 says go, with its parameters if it adopted since
        lr = lr_at(self.step_count, self.inner)
        for group in self.opt.param_groups:
            group["lr"] = lr
        x, y = self.sampler.next()
        self.windows += 1
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with self._autocast():
            loss = self.net(x, y)
        loss.backward()  # under DDP the gradients come out averaged over the ranks
        if self.inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(self.params.values()), self.inner.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_count += 1
        self.total_tokens += self.tokens_per_step
        for f in range(len(self.fragments)):
            self.pending_steps[f] += 1
            self.pending_tokens[f] += self.tokens_per_step
        if self.group is not None:
            return float(self.group.mean(loss))
        return float(loss.detach())

    def train(self, steps: int) -> list[float]:
        return [self.train_step() for _ in range(steps)]

    @torch.no_grad()
    def make_delta(self, fragment: int, *, now: float = 0.0) -> FragmentDelta:
        """Δ = anchor − θ_local for one fragment; the anchor moves to θ_local afterwards."""
        if self.sharded is not None:
            raw = self.group.delta(self, fragment)  # from every rank's shards
        else:
            raw = {}
            for name in self.fragments[fragment]:
                local = self.params[name].detach().float()
                raw[name] = (self.anchor[name] - local).cpu()
                self.anchor[name] = local.clone()
        delta = FragmentDelta(
            learner=self.id,
            fragment=fragment,
            base_version=self.base_version[fragment],
            seq=self.seq,
            steps=self.pending_steps[fragment],
            tokens=self.pending_tokens[fragment],
            tensors=self.compressor.compress(raw),
            sent_at=now,
            windows=self.windows,
        )
        self.seq += 1
        self.pending_steps[fragment] = 0
        self.pending_tokens[fragment] = 0
        self.pushed_at[fragment] = self.step_count
        return delta

    # ---- the way down ---------------------------------------------------------------------
    @torch.no_grad()
    def receive(self, down: DownDelta) -> None:
        """Move the held copy of a fragment one version on: held += decode(down)."""
        f = down.fragment
        if down.version != self.held_version[f] + 1:
            raise ValueError(
                f"fragment {f}: down-delta of version {down.version} on a copy of version {self.held_version[f]}"
            )
        for name, t in down.decoded().items():
            self.held[name] = self.held[name] + t
        self.held_version[f] = down.version

    @torch.no_grad()
    def receive_full(self, fragment: int, params: Mapping[str, torch.Tensor], version: int) -> None:
        """Replace the held copy of a fragment with a full version (no copy, or too far behind)."""
        for name in self.fragments[fragment]:
            self.held[name] = params[name].detach().float().cpu().clone()
        self.held_version[fragment] = version

    def may_adopt(self, fragment: int, overlap: int) -> bool:
        """Has the overlap window τ after the fragment's last push closed (Streaming DiLoCo:
        the merged fragment comes back τ inner steps after the push, arXiv 2501.18512 sec. 2.3)?"""
        at = self.pushed_at[fragment]
        return at is None or self.step_count >= at + overlap

    def adopt_held(self, fragment: int, *, how: Adopt = "replace", alpha: float = 0.0) -> bool:
        """Adopt the held copy if it is newer than what was adopted last; True if it was."""
        if self.held_version[fragment] <= self.base_version[fragment]:
            return False
        held = {n: self.held[n] for n in self.fragments[fragment]}
        self.adopt(fragment, held, self.held_version[fragment], how=how, alpha=alpha)
        return True

    @torch.no_grad()
    def adopt(
        self,
        fragment: int,
        params: Mapping[str, torch.Tensor],
        version: int,
        *,
        how: Adopt = "replace",
        alpha: float = 0.0,
    ) -> None:
        """Take a published fragment; the anchor becomes the global parameters."""
        if self.sharded is not None:
            self.group.adopt(self, fragment, params, how, alpha)  # into every rank's shards
        else:
            for name in self.fragments[fragment]:
                g = params[name].to(self.device, torch.float32)
                apply_adoption(self.params[name], g, self.anchor[name], how, alpha)
                self.anchor[name] = g.clone()
        self.params_changed = True
        self.base_version[fragment] = version
        if version > self.held_version[fragment]:  # adopted from outside the held copy
            self.receive_full(fragment, params, version)

    def rejoin(self, params: Mapping[str, torch.Tensor], versions: Sequence[int]) -> None:
        """Restart from the newest global state with a fresh inner optimizer (a re-placed learner)."""
        self._load(params, versions)

    def state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().float().clone() for n, p in self.params.items()}

    # ---- state that outlives a process ------------------------------------------------------
    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(JSON-able counters, named CPU tensors): everything :meth:`load_state_dict` needs."""
        tensors: dict[str, torch.Tensor] = {}
        for n, p in self.params.items():
            tensors[f"param:{n}"] = p.detach().float().cpu()
            tensors[f"anchor:{n}"] = self.anchor[n].cpu()
            tensors[f"held:{n}"] = self.held[n]
        index = {id(p): i for i, p in enumerate(self.params.values())}
        names = list(self.params)
        opt_keys: dict[str, list[str]] = {}
        for param, st in self.opt.state.items():
            name = names[index[id(param)]]
            opt_keys[name] = sorted(st)
            for key, value in st.items():
                t = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
                tensors[f"opt:{key}:{name}"] = t.detach().float().cpu()
        for n, r in self.compressor.residual.items():
            tensors[f"residual:{n}"] = r.detach().float().cpu()
        sampler = _sampler_state(self.sampler)
        if sampler is not None:
            tensors["sampler"] = sampler
        for rank, state in sorted(self.rank_samplers.items()):
            tensors[f"sampler@{rank}"] = state
        meta = {
            "learner": self.id,
            "step_count": self.step_count,
            "windows": self.windows,
            "seq": self.seq,
            "total_tokens": self.total_tokens,
            "base_version": list(self.base_version),
            "held_version": list(self.held_version),
            "pushed_at": list(self.pushed_at),
            "pending_steps": list(self.pending_steps),
            "pending_tokens": list(self.pending_tokens),
            "opt_keys": opt_keys,
        }
        return meta, tensors

    @torch.no_grad()
    def load_state_dict(self, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
        """Become the learner that :meth:`state_dict` described (same model and fragments)."""
        for n, p in self.params.items():
            p.copy_(tensors[f"param:{n}"].to(p.device))
            self.anchor[n] = tensors[f"anchor:{n}"].to(self.device, torch.float32).clone()
            self.held[n] = tensors[f"held:{n}"].float().clone()
        self._load_optimizer(meta, tensors)
        self.compressor.residual = {
            k[len("residual:") :]: t.float().clone() for k, t in tensors.items() if k.startswith("residual:")
        }
        if "sampler" in tensors:
            _sampler_load(self.sampler, tensors["sampler"])
        self.rank_samplers = {
            int(k.split("@", 1)[1]): t.clone() for k, t in tensors.items() if k.startswith("sampler@")
        }
        self.step_count = int(meta["step_count"])
        self.windows = int(meta.get("windows", self.step_count))  # checkpoints written before it
        self.seq = int(meta["seq"])
        self.total_tokens = int(meta["total_tokens"])
        self.base_version = [int(v) for v in meta["base_version"]]
        self.held_version = [int(v) for v in meta["held_version"]]
        self.pushed_at = [None if v is None else int(v) for v in meta["pushed_at"]]
        self.pending_steps = [int(v) for v in meta["pending_steps"]]
        self.pending_tokens = [int(v) for v in meta["pending_tokens"]]

    def _load_optimizer(self, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
        state: dict[int, dict[str, torch.Tensor]] = {}
        for i, (n, p) in enumerate(self.params.items()):
            keys = meta["opt_keys"].get(n)
            if keys:
                # AdamW keeps "step" as a CPU float tensor and the moments on the param's device.
                state[i] = {
                    k: tensors[f"opt:{k}:{n}"].clone()
                    if k == "step"
                    else tensors[f"opt:{k}:{n}"].to(p.device, p.dtype).clone()
                    for k in keys
                }
        self.opt.load_state_dict({"state": state, "param_groups": self.opt.state_dict()["param_groups"]})

    @torch.no_grad()
    def load_replica(self, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
        """Become a training replica of a learner (another rank of its group): its parameters,
        AdamW state and schedule position, and this rank's sampler position if one was saved.
        Anchors, the held copy and the push bookkeeping stay with rank 0. A sharded group's
        replica comes without parameters (its shards come from rank 0 as a session starts)."""
        for n, p in self.params.items():
            if f"param:{n}" in tensors:
                p.copy_(tensors[f"param:{n}"].to(p.device))
        self._load_optimizer(meta, tensors)
        if "sampler" in tensors:
            _sampler_load(self.sampler, tensors["sampler"])
        self.step_count = int(meta["step_count"])

    def sampler_state(self) -> torch.Tensor | None:
        """This process's sampler position (what a checkpoint saves as ``sampler``)."""
        return _sampler_state(self.sampler)

    def skip_windows(self, count: int) -> None:
        """Draw `count` batches without training on them, here and (at their next start) on the
        learner's other ranks: the windows a chunk that died had trained and already pushed.

        The lr schedule (step_count) does not move: it counts the steps this learner's state
        has taken. Training them again would put those windows into the global model twice
        (the pushes are merged or will be); skipping them keeps every window at most once."""
        for _ in range(count):
            self.sampler.next()
        self.windows += count
        self.rank_skip += count

    @torch.no_grad()
    def forget_pending(self, fragment: int) -> None:
        """Count a fragment's pending steps as pushed: the anchor moves to θ_local.

        For a learner restored from a checkpoint whose fragment was pushed after the
        checkpoint was written (by a chunk that then died): that push carried these steps
        already, and sending them again would count them twice.
        """
        for name in self.fragments[fragment]:
            self.anchor[name] = self.params[name].detach().float().clone()
        self.pending_steps[fragment] = 0
        self.pending_tokens[fragment] = 0


# A sampler's position is its torch.Generator: BatchSampler keeps it as ``gen``. A sampler
# that has its own ``get_state``/``set_state`` (a streamed dataset, say) is asked instead.
def _sampler_state(sampler: Any) -> torch.Tensor | None:
    if hasattr(sampler, "get_state"):
        return torch.as_tensor(sampler.get_state(), dtype=torch.uint8)
    gen = getattr(sampler, "gen", None)
    return gen.get_state() if isinstance(gen, torch.Generator) else None


def _sampler_load(sampler: Any, state: torch.Tensor) -> None:
    if hasattr(sampler, "set_state"):
        sampler.set_state(state)
        return
    gen = getattr(sampler, "gen", None)
    if isinstance(gen, torch.Generator):
        gen.set_state(state.to(torch.uint8))
