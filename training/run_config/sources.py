"""Where a run may read its dataset, model and tokenizer: URI checks against the training data roots."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from registry.store.objectstore import object_store_key
from training.run_config.schema import Errors

if TYPE_CHECKING:
    # Only its type: RunConfig is also loaded where Django's models cannot be (bench.training.bare).
    from registry.store.keys import ObjectReach

# One message for every refused dataset, whether the path exists or not, is outside the roots
# or escapes them through a symlink: the answer must not tell which files exist on a worker.
DATASET_REFUSED = (
    "must be stdlib:// or an existing file:// path or s3:// prefix under a training data root "
    "that an admin configured (SWITCHYARD_TRAINING_DATA_ROOTS)"
)
# The same for a model directory or a tokenizer file (model_uri, tokenizer_uri).
OBJECT_REFUSED = (
    "must be an existing file:// path or s3:// prefix under a training data root "
    "that an admin configured (SWITCHYARD_TRAINING_DATA_ROOTS)"
)


@dataclass(frozen=True)
class DatasetSource:
    """Where a run's data comes from: the stdlib corpus, files under a root, or an S3 prefix."""

    kind: str  # "stdlib" | "files" | "objects"
    path: Path | None = None  # files: the resolved file or directory
    root: Path | None = None  # files: the resolved root it lies under
    bucket: str = ""  # objects
    prefix: str = ""  # objects: the key prefix, no trailing slash


def segments_clean(path: str) -> bool:
    return not any(seg in (".", "..") for seg in path.split("/")) and "\\" not in path and "\x00" not in path


def key_under(key: str, prefix: str) -> bool:
    return not prefix or key == prefix or key.startswith(prefix + "/")


def dataset_source(uri: Any, *, roots: list[str] | None = None) -> DatasetSource | None:
    """The dataset `uri` names if a run may read it, else None (always the same refusal).

    `file://` paths are resolved (symlinks followed) and must exist and lie under a resolved
    `file://` root; `s3://` prefixes must lie under an `s3://` root of the same bucket, with
    whole path segments. Roots are settings.TRAINING_DATA_ROOTS unless given.
    """
    if uri == "stdlib://":
        return DatasetSource(kind="stdlib")
    if not isinstance(uri, str) or not uri.isprintable():
        return None
    roots = settings.TRAINING_DATA_ROOTS if roots is None else roots
    if uri.startswith("file://"):
        raw = uri[len("file://") :]
        if not raw.startswith("/") or not segments_clean(raw):
            return None
        real = Path(os.path.realpath(raw))
        for root in roots:
            if not root.startswith("file://"):
                continue
            root_real = Path(os.path.realpath(root[len("file://") :]))
            if (real == root_real or root_real in real.parents) and real.exists():
                return DatasetSource(kind="files", path=real, root=root_real)
        return None
    if uri.startswith("s3://"):
        bucket, _, key = uri[len("s3://") :].partition("/")
        key = key.rstrip("/")
        if not bucket or not segments_clean(key) or "//" in key:
            return None
        for root in roots:
            if not root.startswith("s3://"):
                continue
            root_bucket, _, root_prefix = root[len("s3://") :].partition("/")
            if bucket == root_bucket and key_under(key, root_prefix):
                return DatasetSource(kind="objects", bucket=bucket, prefix=key)
        return None
    return None


def dataset_files(source: DatasetSource) -> tuple[str, ...]:
    """The files of a `files` source, each re-resolved at read time: a symlink that leads out of
    the root (made after the run was validated) is skipped."""
    assert source.path is not None and source.root is not None  # noqa: S101 (kind == "files")
    candidates = sorted(source.path.rglob("*")) if source.path.is_dir() else [source.path]
    kept = []
    for p in candidates:
        real = Path(os.path.realpath(p))
        if real.is_file() and (real == source.root or source.root in real.parents):
            kept.append(str(real))
    return tuple(kept)


def dataset_keys(source: DatasetSource, keys: list[str]) -> tuple[str, ...]:
    """The object keys of an `objects` source: whole segments under its prefix only."""
    return tuple(k for k in sorted(keys) if key_under(k, source.prefix))


def model_roots() -> list[str]:
    """Where a model directory or tokenizer may be read from: the training data roots, and the
    `runs/` folder of the installation's own store, where registered model versions are written
    (training.run_engines.write_model_version) and from which `start_from` continues, and its
    `teams/` folder, where a team keeps its own models (registry.store.keys)."""
    own = str(settings.OBJECT_STORE_URL).rstrip("/")
    if own.startswith("file://"):
        own = f"file://{os.path.abspath(own[len('file://') :])}"
    return [*settings.TRAINING_DATA_ROOTS, f"{own}/runs", f"{own}/teams"]


def outside_reach(uri: Any, reach: ObjectReach | None) -> bool:
    """Does `uri` name a key of the installation's store that `reach` may not read? Asked before
    anything looks at the path, so another team's key and a key that does not exist read alike.
    A URI outside the store (a training data root of its own) is for dataset_source to judge."""
    if reach is None or not isinstance(uri, str) or uri == "stdlib://":
        return False
    try:
        key = object_store_key(uri)
    except ValueError:  # urlparse: a malformed host ("s3://[x")
        return True
    return key is not None and not reach.may_read(key)


def object_uri_check(uri: Any, *, kind: str, reach: ObjectReach | None = None) -> str | None:
    """What is wrong with an object-store URI a run reads (None if nothing).

    kind: "dataset" (also stdlib://; a file or a directory), "model" (a directory holding
    config.json) or "tokenizer" (a tokenizer.json). Every URI a run config names goes through
    here and must lie under an admin-configured root (dataset_source) and, inside the
    installation's store, be a key of the run's own team (`reach`; None: no caller to judge, as
    `manage.py train`): anything else gets one message whether or not it exists, so the answer
    tells nobody which files a worker or another team has. Inside a root, file:// paths are
    checked for what they must hold; an s3:// object is read when the run's engine is built, and
    its absence fails the run with the reason.
    """
    if kind == "dataset":
        if outside_reach(uri, reach):
            return DATASET_REFUSED
        return None if dataset_source(uri) is not None else DATASET_REFUSED
    if outside_reach(uri, reach):
        return OBJECT_REFUSED
    found = dataset_source(uri, roots=model_roots())
    if found is None or found.kind == "stdlib":
        return OBJECT_REFUSED
    if found.kind == "files":
        assert found.path is not None  # noqa: S101 (kind == "files")
        if kind == "model" and not (found.path / "config.json").is_file():
            return f"{uri} holds no config.json"
        if kind == "tokenizer" and not found.path.is_file():
            return f"{uri} is not a file"
    elif kind == "tokenizer" and not found.prefix:
        return "s3:// URI names no object"
    return None


def check_uris(
    cfg: dict[str, Any], raw: dict[str, Any], errors: Errors, *, reach: ObjectReach | None = None
) -> None:
    """dataset, model_uri and tokenizer_uri, and how they fit data.format and model."""
    problem = object_uri_check(cfg["dataset"], kind="dataset", reach=reach)
    if problem:
        errors.add("dataset", problem)
    for field, kind in (("model_uri", "model"), ("tokenizer_uri", "tokenizer")):
        if cfg[field] is not None and (problem := object_uri_check(cfg[field], kind=kind, reach=reach)):
            errors.add(field, problem)
    text_field = cfg["data"]["text_field"]
    if not isinstance(text_field, str) or not text_field or len(text_field) > 128:
        errors.add("data.text_field", "must be a field or column name (1 to 128 characters)")
    if cfg["model_uri"] is not None:
        model_raw = raw.get("model")
        for key in sorted(set(model_raw) - {"block_size"} if isinstance(model_raw, dict) else ()):
            errors.add(f"model.{key}", "comes from model_uri's config.json (only block_size may be given)")
    fmt = cfg["data"]["format"]
    if errors.has("data.format"):
        return
    if fmt != "bytes" and cfg["dataset"] == "stdlib://":
        errors.add(
            "data.format", f"{fmt} reads the dataset's files; stdlib:// is the byte corpus (format bytes)"
        )
    if fmt == "bytes" and (cfg["model_uri"] is not None or cfg["tokenizer_uri"] is not None):
        errors.add("data.format", "a model_uri or tokenizer_uri needs text: use text, jsonl or parquet")
