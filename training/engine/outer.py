"""The outer optimizer: SGD with Nesterov momentum on outer gradients Δ.

DiLoCo (arXiv 2311.08105, Algorithm 1) treats Δ = θ_global − θ_local, averaged over
learners, as a gradient and applies Nesterov SGD with lr 0.7 and momentum 0.9. This follows
torch.optim.SGD's convention:

    m ← μ·m + Δ            (m starts at 0)
    u ← Δ + μ·m  if nesterov else m
    θ ← θ − lr·u

With lr 1 and μ 0 this is θ ← θ − mean Δ = mean θ_local: plain parameter averaging.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from training.engine.config import OuterConfig


class OuterOptimizer:
    """Momentum per parameter name, so any fragment can be stepped on its own."""

    def __init__(self, cfg: OuterConfig) -> None:
        self.cfg = cfg
        self.momentum: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, params: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor]) -> None:
        """Update ``params`` in place with the outer gradient ``delta`` (same names)."""
        mu = self.cfg.momentum
        for name, g in delta.items():
            p = params[name]
            g = g.to(p.device, torch.float32)
            if mu != 0.0:
                buf = self.momentum.get(name)
                if buf is None:
                    buf = self.momentum[name] = torch.zeros_like(p, dtype=torch.float32)
                buf.mul_(mu).add_(g)
                u = g + mu * buf if self.cfg.nesterov else buf
            else:
                u = g
            p.sub_(self.cfg.lr * u)

    def state_dict(self, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        keys = names if names is not None else list(self.momentum)
        return {n: self.momentum[n].clone() for n in keys if n in self.momentum}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], *, owned: bool = False) -> None:
        """`owned`: the tensors are the optimizer's to keep (not copied)."""
        for n, t in state.items():
            self.momentum[n] = t.detach().float() if owned else t.detach().float().clone()
