"""A training run's config: validation with per-field messages, normalisation, engine mapping.

A config is a JSON object (the launch form, the API and `manage.py train --config` all send
one). `run_config_validate(raw)` returns the normalised dict that is stored on the run, or
raises RunConfigError whose `errors` maps dotted field paths to messages
(`{"learners.quorum": ["must be between 1 and learners.count (2)"]}`). `RunConfig` turns a
stored dict into the engine's dataclasses (training/engine/config.py).

Shape (every key optional except `stop`; defaults in DEFAULTS):

    model:        {n_layer, n_embd, n_head, block_size, dropout}
    dataset:      "stdlib://" | "file:///path/file-or-dir" | "s3://bucket/prefix"
    data:         {max_train_bytes, max_eval_bytes, eval_every_nth_file, sharding, seed}
    learners:     {count: M, quorum: K (1..M), batch_size}
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
    object_store_url: "file://…" | "s3://…"  (default settings.OBJECT_STORE_URL)
    placement:    {accelerator_type, regions: [...], pins: {"<learner index>": "<cluster slug>"}}
    chunk_seconds: seconds of inner steps per Celery task; learner_timeout: seconds of silence
                  before a learner counts as lost;  eval_windows: held-out windows per eval
    seed:         model init seed
"""

from __future__ import annotations

import copy
import math
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
    "dataset": "stdlib://",
    "data": {
        "max_train_bytes": 2_000_000,
        "max_eval_bytes": 200_000,
        "eval_every_nth_file": 10,
        "sharding": "iid",
        "seed": 0,
    },
    "learners": {"count": 2, "quorum": None, "batch_size": 16},
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
    "object_store_url": None,
    "placement": {"accelerator_type": "", "regions": [], "pins": {}},
    "chunk_seconds": 20.0,
    "learner_timeout": 90.0,
    "eval_windows": 128,
    "seed": 0,
}

_CHOICES = {
    "data.sharding": ("iid", "noniid"),
    "fragments.assignment": ("strided", "sequential"),
    "inner.schedule": ("cosine", "constant"),
    "compression.kind": ("fp32", "bf16", "int8", "4bit"),
    "syncer.stale_policy": ("discount", "drop"),
}
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
    "data.seed": (0, BIGINT_MAX),
    "learners.count": (1, 256),
    "learners.batch_size": (1, 4096),
    "h": (1, 100_000),
    "fragments.count": (1, 64),
    "fragments.overlap": (0, 100_000),
    "inner.warmup_steps": (0, BIGINT_MAX),
    "syncer.max_staleness": (0, 1000),
    "eval_windows": (1, 100_000),
    "seed": (0, BIGINT_MAX),
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


def _check_dataset(uri: Any, errors: _Errors) -> None:
    if not isinstance(uri, str) or not uri:
        errors.add("dataset", "must be a URI: stdlib://, file:///path or s3://bucket/prefix")
        return
    if uri == "stdlib://":
        return
    if uri.startswith("file://"):
        path = Path(uri[len("file://") :])
        if not path.exists():
            errors.add("dataset", f"{path} does not exist")
        return
    if uri.startswith("s3://"):
        if not uri[len("s3://") :].strip("/"):
            errors.add("dataset", "s3:// URI names no bucket")
        return
    errors.add("dataset", "must start with stdlib://, file:// or s3://")


def run_config_validate(raw: Any) -> dict[str, Any]:
    """The normalised config, or RunConfigError with every problem found (not just the first)."""
    errors = _Errors()
    if not isinstance(raw, dict):
        raise RunConfigError({"config": ["must be a JSON object"]})
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
    if (
        not errors.has("model.n_embd")
        and not errors.has("model.n_head")
        and model["n_embd"] % model["n_head"]
    ):
        errors.add("model.n_head", "must divide model.n_embd")
    _check_dataset(cfg["dataset"], errors)
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

    frags = cfg["fragments"]
    if (
        isinstance(frags["count"], int)
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

    url = cfg["object_store_url"] or settings.OBJECT_STORE_URL
    if not isinstance(url, str) or not url.startswith(("file://", "s3://")):
        errors.add("object_store_url", "must start with file:// or s3://")
    cfg["object_store_url"] = url

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
    known = set(
        Cluster.objects.filter(slug__in=[s for s in pins.values() if isinstance(s, str)]).values_list(
            "slug", flat=True
        )
    )
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
    def chunk_seconds(self) -> float:
        return float(self.raw["chunk_seconds"])

    @property
    def learner_timeout(self) -> float:
        return float(self.raw["learner_timeout"])

    @property
    def object_store_url(self) -> str:
        return str(self.raw["object_store_url"])

    @property
    def batch_size(self) -> int:
        return int(self.raw["learners"]["batch_size"])

    @property
    def seed(self) -> int:
        return int(self.raw["seed"])

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
        uri = str(self.raw["dataset"])
        source = "stdlib"
        paths: tuple[str, ...] = ()
        if uri.startswith("file://"):
            source = "files"
            root = Path(uri[len("file://") :])
            paths = (
                tuple(str(p) for p in sorted(root.rglob("*")) if p.is_file())
                if root.is_dir()
                else (str(root),)
            )
        elif uri.startswith("s3://"):
            source = "objects"
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
