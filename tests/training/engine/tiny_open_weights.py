"""Tiny open-weights models, tokenizers and text datasets that tests write themselves.

The model directories are written here with the safetensors library directly (not through the
engine's exporter), so a test of the loader does not lean on the code it checks.
"""

from __future__ import annotations

import io
import json
import random
from typing import Any

import torch
from safetensors.torch import save

from storage.objectstore import ObjectStore
from training.engine.model import build_model, family_config_from_hf

VOCAB = 320

_NOUNS = ["cat", "dog", "bird", "fish", "fox", "owl", "cow", "bee"]
_VERBS = ["sees", "chases", "likes", "finds", "hears", "meets"]
_PLACES = ["in the barn", "by the river", "on the hill", "under the tree", "at the farm"]


def tiny_llama_hf(**overrides: Any) -> dict[str, Any]:
    """A Llama config.json: 2 layers, grouped-query attention (4 heads, 2 kv heads), tied head."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 0,
        **overrides,
    }


def tiny_gpt2_hf(**overrides: Any) -> dict[str, Any]:
    """A GPT-2 config.json: 2 layers, 4 heads, width 32."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": VOCAB,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "eos_token_id": 0,
        "torch_dtype": "float32",
        **overrides,
    }


def random_weights(hf: dict[str, Any], *, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter of the model the config describes, perturbed so norms and biases are not 1 or 0."""
    model = build_model(family_config_from_hf(hf), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    return {n: p.detach() + 0.05 * torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def write_model_by_hand(
    store: ObjectStore,
    hf: dict[str, Any],
    tensors: dict[str, torch.Tensor] | None,
    *,
    tokenizer_json: bytes | None = None,
) -> None:
    """config.json, model.safetensors (when tensors are given) and tokenizer.json at the store root."""
    store.put("config.json", json.dumps(hf).encode())
    if tensors is not None:
        store.put("model.safetensors", save({n: t.contiguous() for n, t in tensors.items()}))
    if tokenizer_json is not None:
        store.put("tokenizer.json", tokenizer_json)


def sentences(count: int, *, seed: int = 0) -> list[str]:
    """Short documents from a tiny grammar: easy to learn, so a few steps lower the loss."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = [
            f"the {rng.choice(_NOUNS)} {rng.choice(_VERBS)} the {rng.choice(_NOUNS)} {rng.choice(_PLACES)}."
            for _ in range(rng.randint(1, 3))
        ]
        out.append(" ".join(parts))
    return out


def tiny_tokenizer_json(vocab_size: int = VOCAB) -> bytes:
    """A byte-level BPE tokenizer trained on the tiny grammar; id 0 is <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sentences(200, seed=99), trainer)
    return tok.to_str().encode()


def jsonl(docs: list[str], *, field: str = "text") -> bytes:
    return b"".join(json.dumps({field: d, "id": i}).encode() + b"\n" for i, d in enumerate(docs))


def parquet(docs: list[str], *, column: str = "text", row_group_size: int = 16) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table({column: docs, "n": list(range(len(docs)))}), out, row_group_size=row_group_size)
    return out.getvalue()
