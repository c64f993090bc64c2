"""RunConfig: a stored (validated) config with its engine dataclasses; the demo's config."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from training.engine.config import (
    CompressionConfig,
    DataConfig,
    InnerConfig,
    ModelConfig,
    OuterConfig,
    StreamingConfig,
    SyncerConfig,
)
from training.run_config.schema import DEFAULTS
from training.run_config.sources import DATASET_REFUSED, dataset_files, dataset_source


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
    def sharding(self) -> str:
        """How a learner's ranks split it: "ddp" or "fsdp"; a config stored before it: "ddp"."""
        return str(self.raw["learners"].get("sharding", "ddp"))

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
    def eval_cluster(self) -> str | None:
        """The cluster named to evaluate versions (placement.eval_cluster), or None."""
        value = (self.raw.get("placement") or {}).get("eval_cluster")
        return value if isinstance(value, str) and value else None

    @property
    def keep_versions(self) -> int:
        """K: the newest global versions per fragment that the retention sweep always keeps."""
        # .get: configs stored before the option existed keep the default.
        default = DEFAULTS["syncer"]["keep_versions"]
        return int(self.raw.get("syncer", {}).get("keep_versions", default))

    @property
    def build_or_buy(self) -> dict[str, Any] | None:
        """The normalised `build_or_buy` option (run_config.build_or_buy), or None when off."""
        value = self.raw.get("build_or_buy")
        return dict(value) if isinstance(value, dict) else None

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
