"""Models as directories in the common open-weights layout: read one, train it, write it back.

A model directory (a prefix in the object store) holds

* ``config.json``: the architecture, in the keys its family uses (``model_type`` "llama":
  hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size,
  rms_norm_eps, rope_theta, vocab_size, max_position_embeddings, ...; ``model_type`` "gpt2":
  n_embd, n_layer, n_head, n_positions, vocab_size, ...);
* ``model.safetensors`` (or ``model.safetensors.index.json`` and the shards its ``weight_map``
  names): the weights, by the family's tensor names. Without weights the model starts from a
  seeded random initialisation of that architecture;
* optionally ``tokenizer.json`` (training.engine.tokenizer).

Weights are read with the ``safetensors`` library (a JSON header and raw tensors: loading runs
no code) from files already in the store; nothing is downloaded from elsewhere. The library maps
a local file and reads it tensor by tensor: the store's own file on ``file://``, a copy streamed
to a temp file on S3, so a model's weights never sit in memory as one byte string. They train in fp32 and are
written back in the dtype the config names (``torch_dtype``), so an export is what vLLM or TGI
load from a directory.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from storage.objectstore import FILE_BLOCK, FileStore, ObjectNotFoundError, ObjectStore
from training.engine.config_json import ModelConfigError
from training.engine.gpt2 import GPT2Config
from training.engine.model import FamilyConfig, build_model, family_config_from_hf, load_params, make_model

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Tensors that checkpoints of these families may carry but that are not parameters here: GPT-2's
# causal-mask buffers, the rotary frequencies older Llama exports saved, and a tied head.
_IGNORED = (
    re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$"),
    re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$"),
)


def _json(store: ObjectStore, key: str) -> Any:
    try:
        return json.loads(store.get(key))
    except ValueError as exc:  # bad JSON or bad UTF-8 (a missing object is a KeyError)
        raise ModelConfigError(f"{key} is not JSON: {exc}") from exc


def read_config(store: ObjectStore) -> FamilyConfig:
    """The model's config from ``config.json`` at the store's root (the model directory)."""
    try:
        raw = _json(store, CONFIG)
    except ObjectNotFoundError:
        raise ModelConfigError(f"no {CONFIG} in {store.url}") from None
    return family_config_from_hf(raw)


def parameter_shapes(cfg: FamilyConfig) -> dict[str, torch.Size]:
    """Parameter names and shapes of a config's model, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = make_model(cfg)
    return {n: p.shape for n, p in model.named_parameters()}


@contextmanager
def _local_file(store: ObjectStore, key: str) -> Iterator[Path]:
    """A local file with the object's bytes: the store's own on file://, else a streamed temp copy."""
    if isinstance(store, FileStore):
        yield store.local_path(key)
        return
    with store.open_read(key) as src, tempfile.NamedTemporaryFile(prefix="switchyard-weights-") as tmp:
        shutil.copyfileobj(src, tmp, FILE_BLOCK)
        tmp.flush()
        yield Path(tmp.name)


def _safetensors(store: ObjectStore, key: str) -> dict[str, torch.Tensor]:
    from safetensors import safe_open  # lazily: only open-weights models need it

    with _local_file(store, key) as path, safe_open(str(path), framework="pt") as weights:
        return {name: weights.get_tensor(name) for name in weights.keys()}


def _read_tensors(store: ObjectStore) -> dict[str, torch.Tensor] | None:
    """Every tensor of the checkpoint (one file or an index and its shards), or None if there is none."""
    if store.exists(WEIGHTS):
        files = [WEIGHTS]
    elif store.exists(WEIGHTS_INDEX):
        index = _json(store, WEIGHTS_INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ModelConfigError(f"{WEIGHTS_INDEX} has no weight_map of tensor name -> file")
        files = sorted(set(weight_map.values()))
    else:
        return None
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        try:
            tensors.update(_safetensors(store, name))
        except ObjectNotFoundError:
            raise ModelConfigError(f"{store.url}: {name} is missing") from None
        except Exception as exc:  # safetensors raises its own SafetensorError for a bad header
            raise ModelConfigError(f"{name} is not a safetensors file: {exc}") from exc
    return tensors


def checkpoint_params(cfg: FamilyConfig, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's parameters (fp32) from a checkpoint's tensors, checked name by name and by shape."""
    shapes = parameter_shapes(cfg)
    tied = isinstance(cfg, GPT2Config) or cfg.tie_word_embeddings
    found: dict[str, torch.Tensor] = {}
    unexpected = []
    for raw_name, tensor in tensors.items():
        # GPT2LMHeadModel's own exports put the body under "transformer."; the hub's GPT-2 does not.
        name = raw_name.removeprefix("transformer.") if isinstance(cfg, GPT2Config) else raw_name
        if name in shapes:
            found[name] = tensor
        elif (name == "lm_head.weight" and tied) or any(p.match(name) for p in _IGNORED):
            continue
        else:
            unexpected.append(raw_name)
    missing = [n for n in shapes if n not in found]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (first: {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (first: {sorted(unexpected)[0]})")
        raise ModelConfigError(f"the weights do not match config.json: {'; '.join(parts)}")
    for name, shape in shapes.items():
        if found[name].shape != shape:
            raise ModelConfigError(
                f"{name} has shape {tuple(found[name].shape)}, config.json implies {tuple(shape)}"
            )
    return {n: found[n].to(torch.float32).contiguous() for n in shapes}


def read_model_dir(
    store: ObjectStore, *, seed: int = 0
) -> tuple[FamilyConfig, dict[str, torch.Tensor], bool]:
    """(config, fp32 parameters, True if they came from the checkpoint) of a model directory.

    A directory without weights gives the seeded random initialisation of its architecture.
    """
    cfg = read_config(store)
    tensors = _read_tensors(store)
    if tensors is not None:
        return cfg, checkpoint_params(cfg, tensors), True
    model = build_model(cfg, seed=seed)
    return cfg, {n: p.detach().clone() for n, p in model.named_parameters()}, False


def load_model(store: ObjectStore, *, seed: int = 0) -> torch.nn.Module:
    """The model of a directory with its weights loaded, in eval mode."""
    cfg, params, _ = read_model_dir(store, seed=seed)
    return load_params(make_model(cfg), params).eval()


def write_model_dir(
    store: ObjectStore,
    *,
    cfg: FamilyConfig,
    params: Mapping[str, torch.Tensor],
    tokenizer_json: bytes | None = None,
    dtype: str | None = None,
) -> list[str]:
    """Write config.json, model.safetensors (and tokenizer.json) at the store's root; the keys written.

    ``dtype`` (float32, float16 or bfloat16) defaults to the config's ``torch_dtype``.
    config.json is written last, so a directory with a config is a complete one.
    """
    from safetensors.torch import save_file  # lazily: only open-weights models need it

    name = dtype or cfg.torch_dtype
    if name not in DTYPES:
        raise ModelConfigError(f"torch_dtype {name!r} is not one of {', '.join(DTYPES)}")
    shapes = parameter_shapes(cfg)
    if set(params) != set(shapes):
        missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
        raise ModelConfigError(
            f"parameters do not match the config: missing {missing[:3]}, extra {extra[:3]}"
        )
    tensors = {n: params[n].detach().to("cpu", DTYPES[name]).contiguous() for n in shapes}
    with tempfile.TemporaryDirectory(prefix="switchyard-export-") as tmp:
        path = Path(tmp) / WEIGHTS
        # Written to a file and uploaded from it: a large model goes up in parts, never as one
        # second copy in memory.
        save_file(tensors, str(path), metadata={"format": "pt"})
        store.put_file(WEIGHTS, path)
    written = [WEIGHTS]
    if tokenizer_json is not None:
        store.put(TOKENIZER, tokenizer_json)
        written.append(TOKENIZER)
    config = {**cfg.to_hf(), "torch_dtype": name}
    store.put(CONFIG, json.dumps(config, indent=2, sort_keys=True).encode() + b"\n")
    written.append(CONFIG)
    return written


def read_tokenizer_json(store: ObjectStore, key: str = TOKENIZER) -> bytes | None:
    """The bytes of a tokenizer.json, or None if there is none at ``key``."""
    try:
        return store.get(key)
    except ObjectNotFoundError:
        return None
