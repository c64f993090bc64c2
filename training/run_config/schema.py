"""The run config's defaults, its bounds and choices, and the small helpers validation uses."""

from __future__ import annotations

import copy
import math
from typing import Any

from registry.errors import MultiFieldError
from registry.validation import (
    BIGINT_MAX,
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
    # sharding: how a learner's ranks split it: "ddp" (a whole replica each) or "fsdp" (FSDP2:
    # parameters, gradients and AdamW state sharded over the ranks; training.engine.distributed).
    "learners": {"count": 2, "quorum": None, "batch_size": 16, "ranks": 1, "sharding": "ddp"},
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
        # Global versions kept per fragment besides the pinned ones (training.services.retention).
        "keep_versions": 3,
    },
    "stop": None,
    "money_budget": None,
    "currency": "USD",
    "team": "",
    # eval_cluster: the cluster whose queue evaluates each global version (training.services.
    # evaluation); None: the run's own clusters, a GPU one first.
    "placement": {"accelerator_type": "", "regions": [], "pins": {}, "eval_cluster": None},
    "chunk_seconds": 20.0,
    "learner_timeout": 90.0,
    "eval_windows": 128,
    "seed": 0,
    "register_every_versions": 10,
    "start_from": None,
    # Score registered versions against the APIs of some workflows (run_config.build_or_buy).
    "build_or_buy": None,
}
START_MODES = ("continue", "finetune")
TEAM_MAX_LENGTH = 64

DATA_FORMATS = ("bytes", "text", "jsonl", "parquet")
CHOICES = {
    "data.format": DATA_FORMATS,
    "data.sharding": ("iid", "noniid"),
    "learners.sharding": ("ddp", "fsdp"),
    "fragments.assignment": ("strided", "sequential"),
    "inner.schedule": ("cosine", "constant"),
    "compression.kind": ("fp32", "bf16", "int8", "4bit", "fp4_e3m0"),
    "syncer.stale_policy": ("discount", "drop"),
}
# Ranks (devices, or CPU processes) per learner: one cluster node's worth at most.
MAX_RANKS = 64
MONEY_MAX_DIGITS, MONEY_DECIMAL_PLACES = 20, 9  # TrainingRun.money_budget
# (min, max) for numbers; every bound is finite: a number is stored, and some reach bigint
# columns or torch (a seed beyond 64 bits is an error there).
INT_RANGES: dict[str, tuple[int | None, int | None]] = {
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
    "syncer.keep_versions": (1, 1_000_000),
    "eval_windows": (1, 100_000),
    "seed": (0, BIGINT_MAX),
    "register_every_versions": (0, 1_000_000),
}
FLOAT_RANGES: dict[str, tuple[float | None, float | None]] = {
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
BOOLS = (
    "outer.nesterov",
    "compression.error_feedback",
    "syncer.token_weighting",
    "syncer.adaptive_grace",
    "syncer.radial_directional",
)


def get_path(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        d = d[part]
    return d


def set_path(d: dict[str, Any], path: str, value: Any) -> None:
    *head, last = path.split(".")
    for part in head:
        d = d[part]
    d[last] = value


class Errors:
    def __init__(self) -> None:
        self.by_field: dict[str, list[str]] = {}

    def add(self, path: str, message: str) -> None:
        self.by_field.setdefault(path, []).append(message)

    def has(self, path: str) -> bool:
        return path in self.by_field


def merge_defaults(
    raw: dict[str, Any], defaults: dict[str, Any], errors: Errors, prefix: str = ""
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
            out[key] = merge_defaults(value, defaults[key], errors, prefix=f"{path}.")
        else:
            out[key] = value
    return out


def check_int(cfg: dict[str, Any], path: str, lo: int | None, hi: int | None, errors: Errors) -> None:
    v = get_path(cfg, path)
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            set_path(cfg, path, int(v))
            v = int(v)
        else:
            errors.add(path, "must be an integer")
            return
    if lo is not None and v < lo:
        errors.add(path, f"must be at least {lo}")
    elif hi is not None and v > hi:
        errors.add(path, f"must be at most {hi}")


def check_float(cfg: dict[str, Any], path: str, lo: float | None, hi: float | None, errors: Errors) -> None:
    v = get_path(cfg, path)
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
    set_path(cfg, path, v)
    if lo is not None and v < lo:
        errors.add(path, f"must be at least {lo:g}")
    elif hi is not None and v > hi:
        errors.add(path, f"must be at most {hi:g}")
