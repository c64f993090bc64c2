"""A training run's config: validation with per-field messages, normalisation, engine mapping.

A config is a JSON object (the launch form, the API and `manage.py train --config` all send
one). `run_config_validate(raw)` returns the normalised dict that is stored on the run, or
raises RunConfigError whose `errors` maps dotted field paths to messages
(`{"learners.quorum": ["must be between 1 and learners.count (2)"]}`). `RunConfig` turns a
stored dict into the engine's dataclasses (training/engine/config.py).

Shape (every key optional except `stop`; defaults in DEFAULTS):

    model:        {n_layer, n_embd, n_head, block_size, dropout}   (the byte-level GPT; with
                  model_uri only block_size, the training context length, may be given)
    model_uri:    null | "file:///dir" | "s3://bucket/prefix": a model directory in the open-weights
                  layout (config.json [+ model.safetensors] [+ tokenizer.json]; engine/openweights.py)
    tokenizer_uri: null | URI of a tokenizer.json (default: the model directory's tokenizer.json)
    dataset:      "stdlib://" | "file:///path/file-or-dir" | "s3://bucket/prefix", the last two
                  only under a root of SWITCHYARD_TRAINING_DATA_ROOTS (as model_uri and
                  tokenizer_uri; see dataset_source)
    data:         {format: bytes|text|jsonl|parquet, text_field, eval_every_nth_document,
                   max_train_bytes, max_eval_bytes, eval_every_nth_file, sharding, seed}
                  (bytes: the in-memory byte corpus; the others stream tokenised documents,
                  engine/stream.py)
    learners:     {count: M, quorum: K (1..M), batch_size, ranks: N}
                  (batch_size is a learner's whole batch; with ranks N > 1 each learner is a
                  process group of N ranks, each with batch_size / N windows: engine/distributed.py)
    h:            inner steps between a fragment's syncs
    fragments:    {count: P, assignment, overlap: τ, alpha: α}     (Streaming DiLoCo)
    inner:        {lr, min_lr_ratio, warmup_steps, total_steps|null, weight_decay, grad_clip, schedule}
    outer:        {lr, momentum, nesterov}
    compression:  {kind: fp32|bf16|int8|4bit, error_feedback, down: null|fp32|bf16|int8|4bit}
                  (kind: the learners' Δ going up; down: global versions coming down as a
                  difference from the learners' copy, null = the same kind as up)
    syncer:       {grace_seconds, adaptive_grace, stale_policy: discount|drop, discount,
                   max_staleness, token_weighting, radial_directional}
                  (adaptive_grace: grace_seconds is the cap of a window sized from the learners'
                  observed lags; radial_directional: average norms and directions of the Δs apart)
    stop:         {outer_steps: N} or {token_budget: N}          (exactly one)
    money_budget: "12.50" (a decimal string) or null;   currency: "USD"
    team:         "" or the team the run's spend is billed to (its hard budgets stop the run)
    placement:    {accelerator_type, regions: [...], pins: {"<learner index>": "<cluster slug>"}}
    chunk_seconds: seconds of inner steps per Celery task; learner_timeout: seconds of silence
                  before a learner counts as lost;  eval_windows: held-out windows per eval
    seed:         model init seed
    register_every_versions: k: every k-th global version is registered as a model version
                  (0: only the final one); training.services.lineage
    start_from:   null | {model_version: "<model slug>@<number>" or its id, mode: continue|finetune}:
                  the run's initial weights, and its architecture, come from that version (a
                  switchyard artifact fixes `model`; an open-weights one becomes `model_uri`).
                  "continue" also takes the source run's `dataset`, its `data` (overlaid with
                  what is given) and model.block_size unless given; "finetune" takes nothing else.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings

from stack.registry.errors import MultiFieldError
from stack.registry.validation import (
    BIGINT_MAX,
    InputError,
    currency_parse,
    decimal_check,
    decimal_parse,
    int_parse,
    text_check,
)
from training.engine.config import (
    CompressionConfig,
    DataConfig,
    InnerConfig,
    ModelConfig,
    OuterConfig,
    StreamingConfig,
    SyncerConfig,
)


class RunConfigError(MultiFieldError, ValueError):
    """An invalid run config; `errors` maps dotted field paths to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        first = next(iter(errors.items()), ("config", ["invalid"]))
        super().__init__(
            errors,
            message=f"{first[0]}: {first[1][0]}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
        )


DEFAULTS: dict[str, Any] = {
    "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 64, "dropout": 0.0},
    "model_uri": None,
    "tokenizer_uri": None,
    "dataset": "stdlib://",
    "data": {
        "format": "bytes",
        "text_field": "text",
        "eval_every_nth_document": 10,
        "max_train_bytes": 2_000_000,
        "max_eval_bytes": 200_000,
        "eval_every_nth_file": 10,
        "sharding": "iid",
        "seed": 0,
    },
    "learners": {"count": 2, "quorum": None, "batch_size": 16, "ranks": 1},
    "h": 25,
    "fragments": {"count": 1, "assignment": "strided", "overlap": 0, "alpha": 0.0},
    "inner": {
        "lr": 3e-3,
        "min_lr_ratio": 0.1,
        "warmup_steps": 20,
        "total_steps": None,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "schedule": "cosine",
    },
    "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True},
    "compression": {"kind": "fp32", "error_feedback": False, "down": None},
    "syncer": {
        "grace_seconds": 5.0,
        "adaptive_grace": False,
        "stale_policy": "discount",
        "discount": 0.5,
        "max_staleness": 4,
        "token_weighting": True,
        "radial_directional": False,
    },
    "stop": None,
    "money_budget": None,
    "currency": "USD",
    "team": "",
    "placement": {"accelerator_type": "", "regions": [], "pins": {}},
    "chunk_seconds": 20.0,
    "learner_timeout": 90.0,
    "eval_windows": 128,
    "seed": 0,
    "register_every_versions": 10,
    "start_from": None,
}
START_MODES = ("continue", "finetune")
TEAM_MAX_LENGTH = 64

DATA_FORMATS = ("bytes", "text", "jsonl", "parquet")
_CHOICES = {
    "data.format": DATA_FORMATS,
    "data.sharding": ("iid", "noniid"),
    "fragments.assignment": ("strided", "sequential"),
    "inner.schedule": ("cosine", "constant"),
    "compression.kind": ("fp32", "bf16", "int8", "4bit"),
    "syncer.stale_policy": ("discount", "drop"),
}
# Ranks (devices, or CPU processes) per learner: one cluster node's worth at most.
MAX_RANKS = 64
MONEY_MAX_DIGITS, MONEY_DECIMAL_PLACES = 20, 9  # TrainingRun.money_budget
# (min, max) for numbers; every bound is finite: a number is stored, and some reach bigint
# columns or torch (a seed beyond 64 bits is an error there).
_INT_RANGES: dict[str, tuple[int | None, int | None]] = {
    "model.n_layer": (1, 48),
    "model.n_embd": (8, 4096),
    "model.n_head": (1, 64),
    "model.block_size": (8, 4096),
    "data.max_train_bytes": (1024, 10_000_000_000),
    "data.max_eval_bytes": (256, 1_000_000_000),
    "data.eval_every_nth_file": (0, 1000),
    "data.eval_every_nth_document": (0, 1_000_000),
    "data.seed": (0, BIGINT_MAX),
    "learners.count": (1, 256),
    "learners.batch_size": (1, 4096),
    "learners.ranks": (1, MAX_RANKS),
    "h": (1, 100_000),
    "fragments.count": (1, 64),
    "fragments.overlap": (0, 100_000),
    "inner.warmup_steps": (0, BIGINT_MAX),
    "syncer.max_staleness": (0, 1000),
    "eval_windows": (1, 100_000),
    "seed": (0, BIGINT_MAX),
    "register_every_versions": (0, 1_000_000),
}
_FLOAT_RANGES: dict[str, tuple[float | None, float | None]] = {
    "model.dropout": (0.0, 0.9),
    "fragments.alpha": (0.0, 1.0),
    "inner.lr": (1e-8, 10.0),
    "inner.min_lr_ratio": (0.0, 1.0),
    "inner.weight_decay": (0.0, 10.0),
    "inner.grad_clip": (0.0, 1e6),
    "outer.lr": (1e-6, 10.0),
    "outer.momentum": (0.0, 0.999),
    "syncer.grace_seconds": (0.0, 3600.0),
    "syncer.discount": (0.0, 1.0),
    "chunk_seconds": (0.5, 3600.0),
    "learner_timeout": (5.0, 86_400.0),
}
_BOOLS = (
    "outer.nesterov",
    "compression.error_feedback",
    "syncer.token_weighting",
    "syncer.adaptive_grace",
    "syncer.radial_directional",
)


def _get(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        d = d[part]
    return d


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    for part in head:
        d = d[part]
    d[last] = value


class _Errors:
    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.by_field.setdefault(path, []).append(message)

    def has(self, path: str) -> bool:
        return path in self.by_field


def _merge(
    raw: dict[str, Any], defaults: dict[str, Any], errors: _Errors, prefix: str = ""
) -> dict[str, Any]:
    """Defaults overlaid with `raw`; unknown keys are errors, nested objects must be objects."""
    out = copy.deepcopy(defaults)
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in defaults:
            errors.add(path, "unknown field")
            continue
        if isinstance(defaults[key], dict) and key not in ("pins",):
            if not isinstance(value, dict):
                errors.add(path, "must be an object")
                continue
            out[key] = _merge(value, defaults[key], errors, prefix=f"{path}.")
        else:
            out[key] = value
    return out


def _check_int(cfg: dict[str, Any], path: str, lo: int | None, hi: int | None, errors: _Errors) -> None:
    v = _get(cfg, path)
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            _set(cfg, path, int(v))
            v = int(v)
        else:
            errors.add(path, "must be an integer")
            return
    if lo is not None and v < lo:
        errors.add(path, f"must be at least {lo}")
    elif hi is not None and v > hi:
        errors.add(path, f"must be at most {hi}")


def _check_float(cfg: dict[str, Any], path: str, lo: float | None, hi: float | None, errors: _Errors) -> None:
    v = _get(cfg, path)
    if isinstance(v, bool) or not isinstance(v, int | float):
        errors.add(path, "must be a number")
        return
    try:
        v = float(v)
    except OverflowError:  # an integer of hundreds of digits
        errors.add(path, "must be a finite number")
        return
    if not math.isfinite(v):
        errors.add(path, "must be a finite number")
        return
    _set(cfg, path, v)
    if lo is not None and v < lo:
        errors.add(path, f"must be at least {lo:g}")
    elif hi is not None and v > hi:
        errors.add(path, f"must be at most {hi:g}")


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


def _segments_clean(path: str) -> bool:
    return not any(seg in (".", "..") for seg in path.split("/")) and "\\" not in path and "\x00" not in path


def _key_under(key: str, prefix: str) -> bool:
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
        if not raw.startswith("/") or not _segments_clean(raw):
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
        if not bucket or not _segments_clean(key) or "//" in key:
            return None
        for root in roots:
            if not root.startswith("s3://"):
                continue
            root_bucket, _, root_prefix = root[len("s3://") :].partition("/")
            if bucket == root_bucket and _key_under(key, root_prefix):
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
    return tuple(k for k in sorted(keys) if _key_under(k, source.prefix))


def model_roots() -> list[str]:
    """Where a model directory or tokenizer may be read from: the training data roots, and the
    `runs/` folder of the installation's own store, where registered model versions are written
    (training.run_engines.write_model_version) and from which `start_from` continues."""
    own = str(settings.OBJECT_STORE_URL).rstrip("/")
    if own.startswith("file://"):
        own = f"file://{os.path.abspath(own[len('file://') :])}"
    return [*settings.TRAINING_DATA_ROOTS, f"{own}/runs"]


def object_uri_check(uri: Any, *, kind: str) -> str | None:
    """What is wrong with an object-store URI a run reads (None if nothing).

    kind: "dataset" (also stdlib://; a file or a directory), "model" (a directory holding
    config.json) or "tokenizer" (a tokenizer.json). Every URI a run config names goes through
    here and must lie under an admin-configured root (dataset_source): anything else gets one
    message whether or not it exists, so the answer tells nobody which files a worker has.
    Inside a root, file:// paths are checked for what they must hold; an s3:// object is read
    when the run's engine is built, and its absence fails the run with the reason.
    """
    if kind == "dataset":
        return None if dataset_source(uri) is not None else DATASET_REFUSED
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


def _check_uris(cfg: dict[str, Any], raw: dict[str, Any], errors: _Errors) -> None:
    """dataset, model_uri and tokenizer_uri, and how they fit data.format and model."""
    problem = object_uri_check(cfg["dataset"], kind="dataset")
    if problem:
        errors.add("dataset", problem)
    for field, kind in (("model_uri", "model"), ("tokenizer_uri", "tokenizer")):
        if cfg[field] is not None and (problem := object_uri_check(cfg[field], kind=kind)):
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


def run_config_validate(raw: Any) -> dict[str, Any]:
    """The normalised config, or RunConfigError with every problem found (not just the first)."""
    errors = _Errors()
    if not isinstance(raw, dict):
        raise RunConfigError({"config": ["must be a JSON object"]})
    if "object_store_url" in raw:
        # Runs write to the installation's store (OBJECT_STORE_URL, with its endpoint and
        # credentials); a run that chose its own would use those credentials elsewhere.
        errors.add(
            "object_store_url", "a run cannot choose its object store: every run uses OBJECT_STORE_URL"
        )
        raw = {k: v for k, v in raw.items() if k != "object_store_url"}
    raw = _apply_start_from(raw, errors)
    cfg = _merge(raw, DEFAULTS, errors)
    for path, (ilo, ihi) in _INT_RANGES.items():
        if not errors.has(path.split(".")[0]):
            _check_int(cfg, path, ilo, ihi, errors)
    for path, (flo, fhi) in _FLOAT_RANGES.items():
        if not errors.has(path.split(".")[0]):
            _check_float(cfg, path, flo, fhi, errors)
    for path, choices in _CHOICES.items():
        if not errors.has(path.split(".")[0]) and _get(cfg, path) not in choices:
            errors.add(path, f"must be one of {', '.join(choices)}")
    for path in _BOOLS:
        if not errors.has(path.split(".")[0]) and not isinstance(_get(cfg, path), bool):
            errors.add(path, "must be true or false")
    if errors.by_field.keys() & {"model", "learners", "fragments", "inner", "syncer", "placement", "data"}:
        raise RunConfigError(errors.by_field)

    model = cfg["model"]
    byo_model = cfg["model_uri"] is not None
    if (
        not byo_model
        and not errors.has("model.n_embd")
        and not errors.has("model.n_head")
        and model["n_embd"] % model["n_head"]
    ):
        errors.add("model.n_head", "must divide model.n_embd")
    _check_uris(cfg, raw, errors)
    down = cfg["compression"]["down"]
    if not errors.has("compression") and down is not None and down not in _CHOICES["compression.kind"]:
        errors.add(
            "compression.down",
            f"must be null (as compression.kind) or one of {', '.join(_CHOICES['compression.kind'])}",
        )

    learners = cfg["learners"]
    m = learners["count"] if isinstance(learners["count"], int) else 1
    if learners["quorum"] is None:
        learners["quorum"] = m
    elif isinstance(learners["quorum"], bool) or not isinstance(learners["quorum"], int):
        errors.add("learners.quorum", "must be an integer")
    elif not 1 <= learners["quorum"] <= m:
        errors.add("learners.quorum", f"must be between 1 and learners.count ({m})")
    ranks, batch = learners["ranks"], learners["batch_size"]
    if not errors.has("learners.ranks") and not errors.has("learners.batch_size") and batch % ranks:
        errors.add(
            "learners.ranks", f"must divide learners.batch_size ({batch}): each rank draws batch_size / ranks"
        )

    frags = cfg["fragments"]
    if (
        not byo_model  # the layer count is in the model's config.json, checked when the run starts
        and isinstance(frags["count"], int)
        and isinstance(model["n_layer"], int)
        and frags["count"] > model["n_layer"]
    ):
        errors.add("fragments.count", f"must be at most model.n_layer ({model['n_layer']})")
    if isinstance(frags["overlap"], int) and isinstance(cfg["h"], int) and frags["overlap"] >= cfg["h"]:
        errors.add("fragments.overlap", "must be less than h")
    if isinstance(cfg["h"], int) and isinstance(frags["count"], int) and cfg["h"] < frags["count"]:
        errors.add("h", "must be at least fragments.count")

    inner = cfg["inner"]
    if inner["total_steps"] is not None:
        if isinstance(inner["total_steps"], bool) or not isinstance(inner["total_steps"], int):
            errors.add("inner.total_steps", "must be an integer or null")
        elif not 1 <= inner["total_steps"] <= BIGINT_MAX:
            errors.add("inner.total_steps", f"must be between 1 and {BIGINT_MAX}")

    _check_stop(cfg, errors)
    _check_money(cfg, errors)
    _check_placement(cfg, m, errors)

    # A chunk must finish well inside the broker's visibility timeout, or Redis hands the same
    # message to a second worker while the first still trains it.
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    visibility = options.get("visibility_timeout")
    if visibility and isinstance(cfg["chunk_seconds"], float) and cfg["chunk_seconds"] >= visibility / 2:
        errors.add("chunk_seconds", f"must be less than half the broker visibility timeout ({visibility}s)")
    if (
        not errors.has("learner_timeout")
        and not errors.has("chunk_seconds")
        and cfg["learner_timeout"] <= 2 * cfg["chunk_seconds"]
    ):
        errors.add("learner_timeout", "must be more than twice chunk_seconds")

    if errors.by_field:
        raise RunConfigError(errors.by_field)
    if inner["total_steps"] is None:
        inner["total_steps"] = _default_total_steps(cfg)
    return cfg


_ARCHITECTURE = ("n_layer", "n_embd", "n_head", "block_size")


def _apply_start_from(raw: dict[str, Any], errors: _Errors) -> dict[str, Any]:
    """`raw` with `start_from` resolved to a model version and the model (and, to continue, the
    data) taken from it; unchanged, with field errors, when it names nothing usable."""
    start = raw.get("start_from")
    if start is None:
        return raw
    if not isinstance(start, dict):
        errors.add(
            "start_from", 'must be an object: {"model_version": "<model>@<number>", "mode": "continue"}'
        )
        return raw
    # label, artifact_uri and layout are what normalising adds; they are resolved again here.
    for key in sorted(set(start) - {"model_version", "mode", "label", "artifact_uri", "layout"}):
        errors.add(f"start_from.{key}", "unknown field")
    mode = start.get("mode", "continue")
    if mode not in START_MODES:
        errors.add("start_from.mode", f"must be one of {', '.join(START_MODES)}")
    # Imported here, not at the top: RunConfig is also used where Django is not set up (the
    # benchmark's bare-engine processes), and models cannot load there.
    from training.selectors import model_version_lookup

    ref = start.get("model_version")
    version = model_version_lookup(ref)
    if version is None:
        shown = ref if isinstance(ref, str | int) and not isinstance(ref, bool) else "null"
        errors.add(
            "start_from.model_version",
            f"no model version {shown!r}: give <model slug>@<number> or a model version id",
        )
        return raw
    if errors.has("start_from.mode") or any(k.startswith("start_from.") for k in errors.by_field):
        return raw
    out = copy.deepcopy(raw)
    source = version.run.config
    if mode == "continue":
        if "dataset" not in raw and "dataset" in source:
            out["dataset"] = source["dataset"]
        if isinstance(source.get("data"), dict) and isinstance(raw.get("data", {}), dict):
            out["data"] = {**copy.deepcopy(source["data"]), **raw.get("data", {})}
    if raw.get("model_uri") is not None:
        errors.add("model_uri", "start_from gives the model: leave model_uri empty")
    if "model" in raw and not isinstance(raw["model"], dict):
        return out  # _merge reports it
    model_raw = raw.get("model", {})
    if version.layout == version.Layout.OPEN_WEIGHTS:
        for key in sorted(set(model_raw) - {"block_size"}):
            errors.add(f"model.{key}", "comes from start_from's model version (only block_size may be given)")
        block = model_raw.get("block_size")
        if block is None and mode == "continue":
            block = source.get("model", {}).get("block_size")
        out["model"] = {"block_size": block} if block is not None else {}
        out["model_uri"] = version.artifact_uri
    else:
        # A byte-level GPT: its architecture is fixed by the weights; only dropout may change.
        source_model = dict(source.get("model", {}))
        for key in _ARCHITECTURE:
            if key in model_raw and model_raw[key] != source_model.get(key):
                errors.add(f"model.{key}", f"must be {source_model.get(key)} (start_from's model version)")
        out["model"] = {**source_model, **model_raw}
        out["model_uri"] = None  # reported above if given
    out["start_from"] = {
        "model_version": version.pk,
        "label": str(version),
        "mode": mode,
        "artifact_uri": version.artifact_uri,
        "layout": version.layout,
    }
    return out


def _default_total_steps(cfg: dict[str, Any]) -> int:
    """Length of each learner's cosine schedule: about the inner steps it will take."""
    stop = cfg["stop"]
    if "outer_steps" in stop:
        return max(1, int(stop["outer_steps"]) * int(cfg["h"]))
    per_step = cfg["learners"]["count"] * cfg["learners"]["batch_size"] * cfg["model"]["block_size"]
    return max(1, int(stop["token_budget"]) // per_step)


def _check_stop(cfg: dict[str, Any], errors: _Errors) -> None:
    stop = cfg["stop"]
    if not isinstance(stop, dict):
        errors.add("stop", "required: {outer_steps: N} or {token_budget: N}")
        return
    keys = set(stop)
    unknown = keys - {"outer_steps", "token_budget"}
    for k in sorted(unknown):
        errors.add(f"stop.{k}", "unknown field")
    given = keys & {"outer_steps", "token_budget"}
    if len(given) != 1:
        errors.add("stop", "give exactly one of outer_steps or token_budget")
        return
    (key,) = given
    value = stop[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        errors.add(f"stop.{key}", "must be a positive integer")
    elif value > BIGINT_MAX:
        errors.add(f"stop.{key}", f"must be at most {BIGINT_MAX}")


def _check_money(cfg: dict[str, Any], errors: _Errors) -> None:
    raw = cfg["money_budget"]
    if raw is not None:
        if isinstance(raw, float | bool) or not isinstance(raw, str | int):
            # Floats are refused rather than rounded: money is a decimal string.
            errors.add("money_budget", 'must be a decimal string such as "12.50"')
        else:
            try:
                # The column's limits (TrainingRun.money_budget), in ASCII digits.
                amount = (
                    decimal_parse(raw, max_digits=MONEY_MAX_DIGITS, decimal_places=MONEY_DECIMAL_PLACES)
                    if isinstance(raw, str)
                    else decimal_check(
                        Decimal(raw), max_digits=MONEY_MAX_DIGITS, decimal_places=MONEY_DECIMAL_PLACES
                    )
                )
            except InputError as exc:
                message = str(exc)
                if message.startswith(("not a decimal", "write the number")):
                    message = f'must be a decimal string such as "12.50" ({message})'
                elif message.startswith("not a finite"):
                    message = "must be more than 0"
                errors.add("money_budget", message)
            else:
                if amount <= 0:
                    errors.add("money_budget", "must be more than 0")
                else:
                    cfg["money_budget"] = str(amount)
    cur = cfg["currency"]
    try:
        cfg["currency"] = currency_parse(cur) if isinstance(cur, str) else currency_parse("")
    except InputError as exc:
        errors.add("currency", f"must be an ISO 4217 currency code ({exc})")
    team = cfg["team"]
    if not isinstance(team, str):
        errors.add("team", "must be a team name (a string)")
    elif len(team.strip()) > TEAM_MAX_LENGTH:
        # The ledger's and the budgets' team column.
        errors.add("team", f"at most {TEAM_MAX_LENGTH} characters")
    else:
        try:
            cfg["team"] = text_check(team.strip())
        except InputError as exc:
            errors.add("team", str(exc))


def _check_placement(cfg: dict[str, Any], m: int, errors: _Errors) -> None:
    place = cfg["placement"]
    if not isinstance(place["accelerator_type"], str):
        errors.add("placement.accelerator_type", "must be a string")
    regions = place["regions"]
    if not isinstance(regions, list) or not all(isinstance(r, str) and r for r in regions):
        errors.add("placement.regions", "must be a list of region names")
    pins = place["pins"]
    if not isinstance(pins, dict):
        errors.add("placement.pins", "must map learner index to cluster slug")
        return
    # Imported here, not at the top: RunConfig is also used where Django is not set up (the
    # benchmark's bare-engine learner processes, training.bench_bare), and models cannot load there.
    from stack.registry.models import Cluster

    normalised: dict[str, str] = {}
    slots = {
        slug: max(1, count // max(1, capacity))  # training.selectors.accelerators_per_learner
        for slug, count, capacity in Cluster.objects.filter(
            slug__in=[s for s in pins.values() if isinstance(s, str)]
        ).values_list("slug", "accelerator_count", "capacity")
    }
    known = set(slots)
    ranks = cfg["learners"]["ranks"]
    for key, slug in pins.items():
        try:
            index = key if isinstance(key, int) and not isinstance(key, bool) else int_parse(str(key))
        except InputError:
            errors.add("placement.pins", f"{key!r} is not a learner index")
            continue
        if not 0 <= index < m:
            errors.add("placement.pins", f"learner {index} does not exist (0..{m - 1})")
        elif not isinstance(slug, str) or slug not in known:
            errors.add("placement.pins", f"learner {index}: no cluster {slug!r}")
        elif isinstance(ranks, int) and slots[slug] < ranks:
            errors.add(
                "learners.ranks",
                f"learner {index} is pinned to {slug}, whose learner slots hold {slots[slug]} accelerator(s)",
            )
        else:
            normalised[str(index)] = slug
    place["pins"] = normalised


@dataclass(frozen=True)
class RunConfig:
    """A validated config (the dict stored on the run) with its engine dataclasses."""

    raw: dict[str, Any]

    @property
    def learners(self) -> int:
        return int(self.raw["learners"]["count"])

    @property
    def quorum(self) -> int:
        return int(self.raw["learners"]["quorum"])

    @property
    def h(self) -> int:
        return int(self.raw["h"])

    @property
    def fragment_count(self) -> int:
        return int(self.raw["fragments"]["count"])

    @property
    def outer_steps(self) -> int | None:
        v = self.raw["stop"].get("outer_steps")
        return int(v) if v is not None else None

    @property
    def token_budget(self) -> int | None:
        v = self.raw["stop"].get("token_budget")
        return int(v) if v is not None else None

    @property
    def money_budget(self) -> Decimal | None:
        v = self.raw["money_budget"]
        return Decimal(v) if v is not None else None

    @property
    def team(self) -> str:
        return str(self.raw.get("team") or "")  # runs stored before the key existed have none

    @property
    def chunk_seconds(self) -> float:
        return float(self.raw["chunk_seconds"])

    @property
    def learner_timeout(self) -> float:
        return float(self.raw["learner_timeout"])

    @property
    def object_store_url(self) -> str:
        # Always the installation's store: a value stored by an older version is ignored.
        return str(settings.OBJECT_STORE_URL)

    @property
    def batch_size(self) -> int:
        """A learner's batch per inner step, over all its ranks."""
        return int(self.raw["learners"]["batch_size"])

    @property
    def ranks(self) -> int:
        """Processes (devices) per learner; a config stored before ranks existed has one."""
        return int(self.raw["learners"].get("ranks", 1))

    @property
    def seed(self) -> int:
        return int(self.raw["seed"])

    # Configs stored before these keys existed lack them: read them with their defaults.
    @property
    def model_uri(self) -> str | None:
        return self.raw.get("model_uri")

    @property
    def tokenizer_uri(self) -> str | None:
        return self.raw.get("tokenizer_uri")

    @property
    def data_format(self) -> str:
        return str(self.raw["data"].get("format", "bytes"))

    @property
    def text_field(self) -> str:
        return str(self.raw["data"].get("text_field", "text"))

    @property
    def eval_every_nth_document(self) -> int:
        return int(self.raw["data"].get("eval_every_nth_document", 10))

    @property
    def register_every_versions(self) -> int:
        return int(self.raw.get("register_every_versions", DEFAULTS["register_every_versions"]))

    @property
    def start_from(self) -> dict[str, Any] | None:
        """The resolved `start_from` (model_version id, label, mode, artifact_uri, layout), or None."""
        value = self.raw.get("start_from")
        return dict(value) if isinstance(value, dict) else None

    @property
    def block_size(self) -> int:
        """Tokens per training window (the byte GPT's context; a brought model's training context)."""
        return int(self.raw["model"]["block_size"])

    def model_config(self) -> ModelConfig:
        m = self.raw["model"]
        return ModelConfig(
            n_layer=m["n_layer"],
            n_embd=m["n_embd"],
            n_head=m["n_head"],
            block_size=m["block_size"],
            dropout=m["dropout"],
        )

    def inner_config(self) -> InnerConfig:
        i = self.raw["inner"]
        return InnerConfig(
            lr=i["lr"],
            min_lr_ratio=i["min_lr_ratio"],
            warmup_steps=i["warmup_steps"],
            total_steps=i["total_steps"],
            weight_decay=i["weight_decay"],
            grad_clip=i["grad_clip"],
            batch_size=self.batch_size,
            schedule=i["schedule"],
        )

    def outer_config(self) -> OuterConfig:
        o = self.raw["outer"]
        return OuterConfig(lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"])

    def streaming_config(self) -> StreamingConfig:
        f = self.raw["fragments"]
        return StreamingConfig(
            fragments=f["count"], assignment=f["assignment"], overlap=f["overlap"], alpha=f["alpha"]
        )

    def compression_config(self) -> CompressionConfig:
        c = self.raw["compression"]
        # .get: configs stored before `down` existed compress only the way up.
        return CompressionConfig(
            kind=c["kind"], error_feedback=c["error_feedback"], down=c.get("down", "fp32")
        )

    def syncer_config(self) -> SyncerConfig:
        s = self.raw["syncer"]
        return SyncerConfig(
            learners=self.learners,
            quorum=self.quorum,
            grace=s["grace_seconds"],
            stale_policy=s["stale_policy"],
            discount=s["discount"],
            max_staleness=s["max_staleness"],
            token_weighting=s["token_weighting"],
            radial_directional=bool(s.get("radial_directional", False)),
            adaptive_grace=bool(s.get("adaptive_grace", False)),
        )

    def data_config(self) -> DataConfig:
        d = self.raw["data"]
        # Checked again where the data is read: the roots may have changed since validation.
        found = dataset_source(self.raw["dataset"])
        if found is None:
            raise ValueError(f"dataset: {DATASET_REFUSED}")
        source = found.kind
        paths = dataset_files(found) if found.kind == "files" else ()
        return DataConfig(
            source=source,  # type: ignore[arg-type]
            max_train_bytes=d["max_train_bytes"],
            max_eval_bytes=d["max_eval_bytes"],
            eval_every_nth_file=d["eval_every_nth_file"],
            sharding=d["sharding"],
            seed=d["seed"],
            paths=paths,
        )


def demo_config() -> dict[str, Any]:
    """The demo's run: two learners spread over the demo clusters, a small model over stdlib source.

    Sized to finish in about 2-4 minutes on a 2-core machine that also runs the web app, beat and
    three workers: a 2-block model (about 60K parameters) in two Streaming DiLoCo fragments,
    4-bit deltas, quorum 1 of 2 so the run keeps going while a killed cluster's learner is
    re-placed. Each fragment syncs every 40 inner steps (about a second of training). With
    PostgreSQL and Redis on the shared 2-core machine 100 outer steps took 102 s (eval loss
    5.4 → 1.46); 150 leaves room for the slower SQLite + filesystem-broker demo stack.
    """
    return {
        "model": {"n_layer": 2, "n_embd": 48, "n_head": 4, "block_size": 64},
        "dataset": "stdlib://",
        "data": {"max_train_bytes": 1_000_000, "max_eval_bytes": 100_000},
        "learners": {"count": 2, "quorum": 1, "batch_size": 16},
        "h": 40,
        "fragments": {"count": 2},
        "inner": {"lr": 3e-3, "warmup_steps": 20},
        "compression": {"kind": "4bit"},
        "syncer": {"grace_seconds": 1.0},
        "stop": {"outer_steps": 150},
        "chunk_seconds": 10.0,
        "learner_timeout": 45.0,
        "eval_windows": 64,
    }
