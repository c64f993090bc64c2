"""A small GPT-style decoder over bytes, written in the manner of nanoGPT, and the model families.

The byte-level ``GPT`` is the zero-setup default. A model brought as a ``config.json`` (see
training.engine.openweights) is a Llama (training.engine.llama) or a GPT-2
(training.engine.gpt2); ``make_model`` builds whichever a config names.

Parameter names are stable (``wte.weight``, ``blocks.0.attn.qkv.weight`` ...; the families use
their checkpoints' tensor names): fragments, deltas and published versions are keyed by them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from storage.artifacts import model_artifact_read
from training.engine.config import ModelConfig
from training.engine.config_json import ModelConfigError
from training.engine.gpt2 import GPT2, GPT2Config
from training.engine.llama import Llama, LlamaConfig

if TYPE_CHECKING:
    from training.engine.tokenizer import JsonTokenizer

# A model's config: the byte-level GPT's, or a family's read from a config.json.
AnyModelConfig = ModelConfig | LlamaConfig | GPT2Config
FamilyConfig = LlamaConfig | GPT2Config
# model_type in config.json -> the family's config class.
FAMILIES: dict[str, type[LlamaConfig] | type[GPT2Config]] = {"llama": LlamaConfig, "gpt2": GPT2Config}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError("n_embd must be a multiple of n_head")
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, n_layer pre-norm blocks, tied output head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections (as in nanoGPT).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of shape (B, T, vocab), or the mean cross-entropy when targets are given."""
        _, t = idx.shape
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # weight tying
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_model(cfg: AnyModelConfig) -> nn.Module:
    """The model a config describes, freshly initialised from torch's global generator."""
    if isinstance(cfg, LlamaConfig):
        return Llama(cfg)
    if isinstance(cfg, GPT2Config):
        return GPT2(cfg)
    return GPT(cfg)


def build_model(cfg: AnyModelConfig, *, seed: int = 0) -> nn.Module:
    """A freshly initialised model; the same seed gives the same weights."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return make_model(cfg)
    finally:
        torch.random.set_rng_state(gen_state)


@torch.no_grad()
def load_params(model: nn.Module, params: dict[str, torch.Tensor]) -> nn.Module:
    """Copy ``params`` (keyed like ``named_parameters``, so a tied head appears once) into ``model``."""
    for name, p in model.named_parameters():
        p.copy_(params[name])
    return model


def family_config_from_hf(d: dict[str, Any]) -> FamilyConfig:
    """A family's config from the contents of its config.json (``model_type`` picks the family)."""
    if not isinstance(d, dict):
        raise ModelConfigError("config.json must hold a JSON object")
    kind = d.get("model_type")
    family = FAMILIES.get(kind) if isinstance(kind, str) else None
    if family is None:
        raise ModelConfigError(
            f"config.json: model_type {kind!r} is not supported (supported: {', '.join(sorted(FAMILIES))})"
        )
    return family.from_hf(d)


def model_config_to_dict(cfg: AnyModelConfig) -> dict[str, Any]:
    """A config as plain JSON: the byte GPT's fields, or a family's config.json."""
    if isinstance(cfg, LlamaConfig | GPT2Config):
        return cfg.to_hf()
    return asdict(cfg)


def model_config_from_dict(d: dict[str, Any]) -> AnyModelConfig:
    """The inverse of ``model_config_to_dict``."""
    if "model_type" in d:
        return family_config_from_hf(d)
    return ModelConfig(**d)


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def model_from_artifact(*, uri: str, endpoint_url: str | None = None) -> tuple[GPT, dict[str, object]]:
    """The byte GPT rebuilt from a model artifact (storage.artifacts), in eval mode, with its header meta."""
    cfg, params, meta = model_artifact_read(uri=uri, endpoint_url=endpoint_url)
    if "model_type" in cfg:
        # Local serving speaks bytes; a family model is served from its open-weights export.
        raise ModelConfigError(f"{uri} holds a {cfg['model_type']} model, not the byte-level GPT")
    model = GPT(ModelConfig(**cfg))
    model.load_state_dict(params)
    model.eval()
    return model, meta


@dataclass
class ServedModel:
    """A model ready to generate: the network in eval mode, its tokenizer (None: UTF-8 bytes,
    the byte GPT's alphabet), its context length and end-of-sequence id."""

    model: nn.Module
    context_length: int
    tokenizer: JsonTokenizer | None = None
    eos_id: int | None = None
    meta: dict[str, object] = field(default_factory=dict)


def _is_model_dir(uri: str, endpoint_url: str | None) -> bool:
    """Whether ``uri`` names a directory holding a config.json (not an artifact object)."""
    from storage.objectstore import open_store

    if uri.startswith("file://"):
        return (Path(uri[len("file://") :]) / "config.json").is_file()
    folder, _, name = uri.rstrip("/").rpartition("/")
    if not name or folder.endswith(":/"):  # s3://bucket: the bucket's root
        return open_store(uri, endpoint_url=endpoint_url).exists("config.json")
    return open_store(folder, endpoint_url=endpoint_url).exists(f"{name}/config.json")


def model_for_serving(*, uri: str, endpoint_url: str | None = None) -> ServedModel:
    """The model at ``uri``, for local serving: a switchyard artifact (the byte GPT, UTF-8 bytes
    in and out) or a directory in the open-weights layout (a Llama or GPT-2 with the
    ``tokenizer.json`` beside it; training.engine.openweights), such as a run's final export."""
    # Lazily: openweights imports this module.
    from storage.objectstore import open_store
    from training.engine.openweights import TOKENIZER, read_model_dir, read_tokenizer_json
    from training.engine.stream import check_tokens_fit
    from training.engine.tokenizer import JsonTokenizer, eos_from_config

    if not _is_model_dir(uri, endpoint_url):
        model, meta = model_from_artifact(uri=uri, endpoint_url=endpoint_url)
        return ServedModel(model=model, context_length=model.cfg.block_size, meta=meta)
    store = open_store(uri.rstrip("/"), endpoint_url=endpoint_url)
    cfg, params, from_checkpoint = read_model_dir(store)
    if not from_checkpoint:
        raise ModelConfigError(f"{uri} holds a config.json but no weights")
    data = read_tokenizer_json(store)
    if data is None:
        kind = cfg.to_hf()["model_type"]
        raise ModelConfigError(f"{uri} has no {TOKENIZER}: a {kind} model needs one to serve text")
    eos = eos_from_config(cfg.extra)
    tokenizer = JsonTokenizer(data, eos_id=eos)
    check_tokens_fit(tokenizer, cfg.vocab_size)
    net = load_params(make_model(cfg), params).eval()
    return ServedModel(
        model=net,
        context_length=cfg.context_length,
        tokenizer=tokenizer,
        eos_id=eos,
        meta={"model_config": cfg.to_hf()},
    )
