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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Literal

import torch

from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, InnerConfig
from training.engine.data import Sampler
from training.engine.messages import FragmentDelta
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
    ) -> None:
        self.id = learner_id
        self.inner = inner
        self.fragments = fragments
        self.sampler = sampler
        self.device = torch.device(device) if device is not None else default_device()
        self.model = make_model(model_cfg).to(self.device)
        self.params = dict(self.model.named_parameters())
        self.compressor = Compressor(compression or CompressionConfig())
        self.step_count = 0  # position in the inner lr schedule
        self.seq = 0
        self.tokens_per_step = sampler.batch_size * sampler.block_size
        self.total_tokens = 0
        self._load(init, versions)

    def _load(self, init: Mapping[str, torch.Tensor], versions: Sequence[int] | None) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(init[name])
        self.anchor = {n: p.detach().float().clone() for n, p in self.params.items()}
        self.base_version = list(versions) if versions is not None else [0] * len(self.fragments)
        self.pending_steps = [0] * len(self.fragments)
        self.pending_tokens = [0] * len(self.fragments)
        self.opt = make_inner_optimizer(list(self.params.values()), self.inner)
        self.compressor.reset()

    def _autocast(self) -> torch.autocast | nullcontext[None]:
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def train_step(self) -> float:
        """One inner step; returns the training loss."""
        lr = lr_at(self.step_count, self.inner)
        for group in self.opt.param_groups:
            group["lr"] = lr
        x, y = self.sampler.next()
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with self._autocast():
            loss = self.model(x, y)
        loss.backward()
        if self.inner.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.inner.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_count += 1
        self.total_tokens += self.tokens_per_step
        for f in range(len(self.fragments)):
            self.pending_steps[f] += 1
            self.pending_tokens[f] += self.tokens_per_step
        return float(loss.detach())

    def train(self, steps: int) -> list[float]:
        return [self.train_step() for _ in range(steps)]

    @torch.no_grad()
    def make_delta(self, fragment: int, *, now: float = 0.0) -> FragmentDelta:
        """Δ = anchor − θ_local for one fragment; the anchor moves to θ_local afterwards."""
        raw: dict[str, torch.Tensor] = {}
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
        )
        self.seq += 1
        self.pending_steps[fragment] = 0
        self.pending_tokens[fragment] = 0
        return delta

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
        for name in self.fragments[fragment]:
            g = params[name].to(self.device, torch.float32)
            p = self.params[name]
            if how == "replace":
                p.copy_(g)
            elif how == "mix":
                p.mul_(alpha).add_(g, alpha=1.0 - alpha)
            else:  # rebase: keep the progress since the last push on top of the new global
                p.add_(g - self.anchor[name])
            self.anchor[name] = g.clone()
        self.base_version[fragment] = version

    def rejoin(self, params: Mapping[str, torch.Tensor], versions: Sequence[int]) -> None:
        """Restart from the newest global state with a fresh inner optimizer (a re-placed learner)."""
        self._load(params, versions)

    def state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().float().clone() for n, p in self.params.items()}
