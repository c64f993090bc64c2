"""The Llama family of decoders, written in the manner of nanoGPT.

Pre-norm blocks with RMSNorm (Zhang & Sennrich, arXiv 1910.07467), rotary position embeddings
(Su et al., arXiv 2104.09864), grouped-query attention (Ainslie et al., arXiv 2305.13245) and a
SwiGLU feed-forward layer (Shazeer, arXiv 2002.05202), as in Llama (arXiv 2302.13971) and Llama 2
and 3. The module tree mirrors the common open-weights layout of these checkpoints, so parameter
names are the tensor names of a ``model.safetensors`` file: ``model.embed_tokens.weight``,
``model.layers.0.self_attn.q_proj.weight``, ``model.layers.0.mlp.gate_proj.weight``,
``model.norm.weight``, ``lm_head.weight`` (absent when the head is tied to the embedding).

Rotary embeddings use the "half-split" pairing of that layout: feature i is rotated together
with feature i + head_dim/2 (not with its neighbour, as in the original Meta release, whose
q/k projection rows the conversion to this layout permutes to match).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training.engine.config_json import ModelConfigError, hf_bool, hf_float, hf_int

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Llama ``config.json`` this implementation reads (same names, same meaning)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None, or Llama 3.1's {"rope_type": "llama3", "factor", "low_freq_factor",
    # "high_freq_factor", "original_max_position_embeddings"}.
    rope_scaling: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    torch_dtype: str = "float32"
    # Every other key of the source config.json (bos/eos token ids, ...), written back on export.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> LlamaConfig:
        hidden = hf_int(d, "hidden_size")
        heads = hf_int(d, "num_attention_heads")
        kv_heads = hf_int(d, "num_key_value_heads", heads)
        if heads < 1 or kv_heads < 1 or heads % kv_heads:
            raise ModelConfigError(
                f"config.json: num_key_value_heads must divide num_attention_heads ({kv_heads} and {heads})"
            )
        if d.get("head_dim") is None and hidden % heads:
            raise ModelConfigError("config.json: num_attention_heads must divide hidden_size")
        head_dim = hf_int(d, "head_dim") if d.get("head_dim") is not None else hidden // heads
        if head_dim % 2:
            raise ModelConfigError(
                f"config.json: head_dim must be even for rotary embeddings, got {head_dim}"
            )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ModelConfigError(f"config.json: hidden_act {act!r} is not supported (Llama uses silu)")
        # Rotary settings: rope_theta and rope_scaling at the top level (most published
        # checkpoints), or one rope_parameters object holding both (newer exports).
        rope = d.get("rope_parameters")
        if rope is not None and not isinstance(rope, dict):
            raise ModelConfigError("config.json: rope_parameters must be an object")
        theta = hf_float(rope or d, "rope_theta", 10000.0)
        scaling = dict(rope) if rope is not None else d.get("rope_scaling")
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
            if kind not in ("default", "llama3"):
                raise ModelConfigError(
                    f"config.json: rope scaling {scaling!r} is not supported (only llama3 or default)"
                )
            if kind == "default":
                scaling = None
            else:
                scaling.pop("rope_theta", None)
                for key in ("factor", "original_max_position_embeddings"):
                    hf_float(scaling, key)  # required, and a number
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        known |= {"model_type", "hidden_act", "rope_parameters", "dtype", "architectures"}
        return cls(
            vocab_size=hf_int(d, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=hf_int(d, "intermediate_size"),
            num_hidden_layers=hf_int(d, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=hf_int(d, "max_position_embeddings", 2048),
            rms_norm_eps=hf_float(d, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=dict(scaling) if scaling is not None else None,
            tie_word_embeddings=hf_bool(d, "tie_word_embeddings", False),
            attention_bias=hf_bool(d, "attention_bias", False),
            mlp_bias=hf_bool(d, "mlp_bias", False),
            initializer_range=hf_float(d, "initializer_range", 0.02),
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            extra={k: v for k, v in d.items() if k not in known},
        )

    def to_hf(self) -> dict[str, Any]:
        """The config.json of this model (the source's other keys kept)."""
        out: dict[str, Any] = {**self.extra, "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE}
        out.update(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias,
            mlp_bias=self.mlp_bias,
            initializer_range=self.initializer_range,
            hidden_act="silu",
            torch_dtype=self.torch_dtype,
        )
        return out

    @property
    def context_length(self) -> int:
        return self.max_position_embeddings


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · weight, computed in fp32 (arXiv 1910.07467)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_frequencies(cfg: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies θ^(-2i/d) of the rotary embedding, i < d/2 (arXiv 2104.09864 eq. 15).

    With Llama 3.1's ``rope_scaling`` (rope_type "llama3"), long wavelengths are divided by
    ``factor``, short ones kept, and those in between interpolated smoothly: the scheme Meta
    released with Llama 3.1 to extend the context from ``original_max_position_embeddings``.
    """
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = cfg.rope_scaling
    if s is None:
        return inv.float()
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    original = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = original / low, original / high
    smooth = ((original / wavelen) - low) / (high - low) if high != low else torch.zeros_like(inv)
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    middle = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    blended = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(middle, blended, scaled).float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    """Causal self-attention with rotary q/k and n_kv ≤ n_head key/value heads (GQA)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_head * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.n_kv != self.n_head:  # each key/value head serves n_head / n_kv query heads
            k = k.repeat_interleave(self.n_head // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) · up(x)) (arXiv 2002.05202)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """Embedding, decoder layers and final norm: the ``model.`` part of the tensor names."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Llama(nn.Module):
    """A Llama-family causal LM; ``forward(idx)`` gives logits, ``forward(idx, targets)`` the loss."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = LlamaBody(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_frequencies(cfg), persistent=False)
        self.apply(self._init_weights)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def rotary(self, t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of position · frequency for positions 0..t-1, shape (t, head_dim), in fp32."""
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        pos = torch.arange(t, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq.to(device))
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of shape (B, T, vocab), or the mean cross-entropy when targets are given."""
        _, t = idx.shape
        cos, sin = self.rotary(t, idx.device)
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
