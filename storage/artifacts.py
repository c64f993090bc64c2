"""Model artifacts: a trained model's config and parameters as one object in the store.

The format is a tensor blob (storage.tensorblob: a JSON header and raw tensors, no pickle, so
loading an artifact never runs code) whose header names the format and carries the model
config as a plain dict, streamed into and out of the store tensor by tensor (blob_write /
blob_read), so no artifact exists as one byte string. Training writes one when a run succeeds; the engine rebuilds the model
from it (training.engine.model.model_from_artifact) for local serving. Torch is imported
lazily: the web process imports this module without needing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from storage.objectstore import ObjectNotFoundError, open_store

if TYPE_CHECKING:
    import torch

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
    model_config: Mapping[str, Any],
    params: dict[str, torch.Tensor],
    meta: dict[str, object] | None = None,
    endpoint_url: str | None = None,
) -> str:
    """Write the artifact at `key` under `store_url` and return its URI (write-once: same key, same bytes)."""
    from storage.tensorblob import blob_write  # lazily: it imports torch

    header = {"format": ARTIFACT_FORMAT, "model_config": dict(model_config), **(meta or {})}
    tensors = {name: t.detach().float().cpu() for name, t in params.items()}
    blob_write(open_store(store_url, endpoint_url=endpoint_url), key, header, tensors, if_absent=True)
    return f"{store_url.rstrip('/')}/{key.lstrip('/')}"


def model_artifact_read(
    *, uri: str, endpoint_url: str | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, object]]:
    """(model config as a dict, parameters, header meta) of the artifact at `uri`."""
    from storage.tensorblob import blob_read  # lazily: it imports torch

    folder, name = _split(uri)
    try:
        meta, tensors = blob_read(open_store(folder, endpoint_url=endpoint_url), name)
    except ObjectNotFoundError as exc:
        raise ArtifactError(f"no artifact at {uri}") from exc
    except ValueError as exc:
        raise ArtifactError(f"{uri} is not a model artifact: {exc}") from exc
    if meta.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{uri} has format {meta.get('format')!r}, expected {ARTIFACT_FORMAT}")
    if not isinstance(meta.get("model_config"), dict):
        raise ArtifactError(f"{uri} carries no model config")
    return dict(meta["model_config"]), tensors, meta
