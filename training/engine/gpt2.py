"""The GPT-2 family of decoders, written in the manner of nanoGPT.

Learned token and position embeddings, pre-norm blocks with LayerNorm, a GELU feed-forward layer
and an output head tied to the token embedding (Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners", sec. 2.3). The module tree mirrors the common open-weights
layout of GPT-2 checkpoints, so parameter names are the tensor names of a ``model.safetensors``
file: ``wte.weight``, ``wpe.weight``, ``h.0.ln_1.weight``, ``h.0.attn.c_attn.weight``,
``h.0.mlp.c_fc.weight``, ``ln_f.bias`` ...

GPT-2's dense layers keep the orientation of the original TensorFlow release: a weight of shape
(in, out) applied as x @ W + b (``Conv1D`` below), the transpose of ``nn.Linear``. Keeping it
means a checkpoint loads and exports without transposing anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.engine.config_json import ModelConfigError, hf_bool, hf_float, hf_int

MODEL_TYPE = "gpt2"
ARCHITECTURE = "GPT2LMHeadModel"

# activation_function values of GPT-2 configs and the GELU they name: "gelu_new" is the tanh
# approximation GPT-2 was trained with.
_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none"}


@dataclass(frozen=True)
class GPT2Config:
    """The fields of a GPT-2 ``config.json`` this implementation reads (same names, same meaning)."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    torch_dtype: str = "float32"
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> GPT2Config:
        n_embd, n_head = hf_int(d, "n_embd"), hf_int(d, "n_head")
        if n_embd % n_head:
            raise ModelConfigError(f"config.json: n_head ({n_head}) must divide n_embd ({n_embd})")
        act = d.get("activation_function", "gelu_new")
        if act not in _GELU:
            raise ModelConfigError(f"config.json: activation_function {act!r} is not supported")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
            if hf_bool(d, flag, False):
                raise ModelConfigError(f"config.json: {flag} is not supported")
        if not hf_bool(d, "scale_attn_weights", True):
            raise ModelConfigError("config.json: scale_attn_weights false is not supported")
        if not hf_bool(d, "tie_word_embeddings", True):
            raise ModelConfigError(
                "config.json: GPT-2 ties its output head; tie_word_embeddings must be true"
            )
        n_inner = d.get("n_inner")
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        known |= {"model_type", "dtype", "architectures", "tie_word_embeddings"}
        return cls(
            vocab_size=hf_int(d, "vocab_size"),
            n_positions=hf_int(d, "n_positions", d.get("n_ctx", 1024)),
            n_embd=n_embd,
            n_layer=hf_int(d, "n_layer"),
            n_head=n_head,
            n_inner=hf_int(d, "n_inner") if n_inner is not None else 4 * n_embd,
            activation_function=act,
            layer_norm_epsilon=hf_float(d, "layer_norm_epsilon", 1e-5),
            initializer_range=hf_float(d, "initializer_range", 0.02),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_hf(self) -> dict[str, Any]:
        """The config.json of this model (the source's other keys kept)."""
        out: dict[str, Any] = {**self.extra, "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE}
        out.update(
            vocab_size=self.vocab_size,
            n_positions=self.n_positions,
            n_embd=self.n_embd,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_inner=self.n_inner,
            activation_function=self.activation_function,
            layer_norm_epsilon=self.layer_norm_epsilon,
            initializer_range=self.initializer_range,
            tie_word_embeddings=True,
            torch_dtype=self.torch_dtype,
        )
        return out

    @property
    def context_length(self) -> int:
        return self.n_positions


class Conv1D(nn.Module):
    """GPT-2's dense layer: weight (in, out), y = x @ W + b (see the module docstring)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)  # q, k and v, in that order
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, cfg.n_inner)
        self.c_proj = Conv1D(cfg.n_inner, cfg.n_embd)
        self.approximate = _GELU[cfg.activation_function]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """A GPT-2-family causal LM; ``forward(idx)`` gives logits, ``forward(idx, targets)`` the loss."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        std = cfg.initializer_range
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                # Residual projections scaled by 1/sqrt(2 · n_layer) (GPT-2 paper, sec. 2.3).
                nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * cfg.n_layer))
            elif name.endswith(("c_attn.weight", "c_fc.weight", "wte.weight", "wpe.weight")):
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of shape (B, T, vocab), or the mean cross-entropy when targets are given."""
        _, t = idx.shape
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # the tied head
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
