"""Model artifacts: a trained model's config and parameters as one object in the store.

The format is the engine's tensor blob (training.engine.messages.pack: a JSON header and raw
tensors, no pickle, so loading an artifact never runs code). Training writes one when a run
succeeds; the inference app's local provider reads it. Torch is imported lazily: the web
process imports this module without needing torch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from training.engine.objectstore import open_store

if TYPE_CHECKING:
    import torch

    from training.engine.config import ModelConfig

ARTIFACT_FORMAT = "switchyard-model/1"


class ArtifactError(ValueError):
    """The URI does not name a readable model artifact."""


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith(("file://", "s3://")):
        raise ArtifactError(f"artifact URI must start with file:// or s3://, got {uri!r}")
    folder, _, name = uri.rstrip("/").rpartition("/")
    if not name or folder.endswith(":/"):
        raise ArtifactError(f"artifact URI {uri!r} names no object")
    return folder, name


def model_artifact_write(
    *,
    store_url: str,
    key: str,
    model_cfg: ModelConfig,
    params: dict[str, torch.Tensor],
    meta: dict[str, object] | None = None,
    endpoint_url: str | None = None,
) -> str:
    """Write the artifact at `key` under `store_url` and return its URI (write-once: same key, same bytes)."""
    from training.engine.messages import pack

    header = {"format": ARTIFACT_FORMAT, "model_config": dataclasses.asdict(model_cfg), **(meta or {})}
    blob = pack(header, {name: t.detach().float().cpu() for name, t in params.items()})
    open_store(store_url, endpoint_url=endpoint_url).put_if_absent(key, blob)
    return f"{store_url.rstrip('/')}/{key.lstrip('/')}"


def model_artifact_read(
    *, uri: str, endpoint_url: str | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, object]]:
    """(model config, parameters, header meta) of the artifact at `uri`."""
    from training.engine.config import ModelConfig
    from training.engine.messages import unpack
    from training.engine.objectstore import ObjectNotFoundError

    folder, name = _split(uri)
    try:
        blob = open_store(folder, endpoint_url=endpoint_url).get(name)
    except ObjectNotFoundError as exc:
        raise ArtifactError(f"no artifact at {uri}") from exc
    try:
        meta, tensors = unpack(blob)
    except ValueError as exc:
        raise ArtifactError(f"{uri} is not a model artifact: {exc}") from exc
    if meta.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{uri} has format {meta.get('format')!r}, expected {ARTIFACT_FORMAT}")
    return ModelConfig(**meta["model_config"]), tensors, meta


def model_artifact_load(
    *, uri: str, endpoint_url: str | None = None
) -> tuple[torch.nn.Module, dict[str, object]]:
    """The GPT rebuilt from an artifact, in eval mode, with its header meta."""
    from training.engine.model import GPT

    cfg, params, meta = model_artifact_read(uri=uri, endpoint_url=endpoint_url)
    model = GPT(cfg)
    model.load_state_dict(params)
    model.eval()
    return model, meta
