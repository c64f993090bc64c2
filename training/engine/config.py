"""Hyperparameters as dataclasses, one per concern (nanoGPT style)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# "4bit" is uniform int4; "fp4_e3m0" is the FP4 of Streaming DiLoCo (compression.py).
CompressionKind = Literal["fp32", "bf16", "int8", "4bit", "fp4_e3m0"]
StalePolicy = Literal["discount", "drop"]
Assignment = Literal["strided", "sequential"]
Sharding = Literal["iid", "noniid"]


@dataclass(frozen=True)
class ModelConfig:
    """A small GPT-style decoder over bytes (vocab 256)."""

    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    block_size: int = 128  # context length in bytes
    vocab_size: int = 256
    dropout: float = 0.0


@dataclass(frozen=True)
class InnerConfig:
    """The learner's inner AdamW (arXiv 2311.08105 keeps one AdamW per learner)."""

    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 50
    total_steps: int = 500  # length of the cosine schedule
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    batch_size: int = 32
    optimizer: Literal["adamw", "sgd"] = "adamw"  # "sgd" exists for the identity tests
    schedule: Literal["cosine", "constant"] = "cosine"  # constant: after warmup, for time-to-target


@dataclass(frozen=True)
class OuterConfig:
    """Outer SGD with Nesterov momentum; lr 0.7 and momentum 0.9 as in arXiv 2311.08105 sec. 3."""

    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True


@dataclass(frozen=True)
class StreamingConfig:
    """Streaming DiLoCo (arXiv 2501.18512): P fragments on a staggered schedule.

    Fragment p syncs at inner steps t with (t - offset_p) mod H == 0, offset_p = p * H // P.
    With overlap tau > 0 the learner keeps training tau steps before the merged fragment
    comes back and is mixed in as theta = alpha * theta_local + (1 - alpha) * theta_global
    (sec. 2.3 of the paper; alpha = 0 is plain replacement, the paper found alpha = 0.5 best).
    """

    fragments: int = 1
    assignment: Assignment = "strided"
    overlap: int = 0
    alpha: float = 0.0


@dataclass(frozen=True)
class CompressionConfig:
    """How outer gradients travel up and global versions travel down; summed in fp32.

    ``kind`` compresses the learners' Δ (up). ``down`` compresses the difference between a
    newly published global version and the copy every learner already holds (None: the same
    kind as up); a learner with no copy (a rejoin) downloads the version in fp32.
    ``error_feedback`` is the learner side's: each learner carries its quantisation residual
    into its next Δ (off by default; the way down always has it, through the syncer's mirror).
    """

    kind: CompressionKind = "fp32"
    error_feedback: bool = False
    down: CompressionKind | None = None

    @property
    def down_kind(self) -> CompressionKind:
        return self.down if self.down is not None else self.kind


@dataclass(frozen=True)
class SyncerConfig:
    """Decoupled syncer policy (arXiv 2604.21428).

    quorum: merge a fragment once this many learners reported a delta on its current version
    (None means all M, i.e. a barrier). grace: virtual/real seconds to wait for late learners
    after the quorum is reached; with adaptive_grace it is the cap of a window the syncer sizes
    from the learners' observed arrival lags (see syncer.py). Stale deltas (base version older than the current one) are
    applied with weight discount ** staleness, or dropped; anything staler than
    max_staleness is always dropped.
    """

    learners: int = 1
    quorum: int | None = None
    grace: float = 0.0
    stale_policy: StalePolicy = "discount"
    discount: float = 0.5
    max_staleness: int = 4
    token_weighting: bool = True
    radial_directional: bool = False
    adaptive_grace: bool = False


@dataclass(frozen=True)
class DataConfig:
    """Where bytes come from and how they are split across learners."""

    source: Literal["stdlib", "files", "objects"] = "stdlib"
    max_train_bytes: int = 4_000_000
    max_eval_bytes: int = 400_000
    eval_every_nth_file: int = 10  # file i is held out for eval when i % n == 0
    sharding: Sharding = "iid"
    seed: int = 0
    paths: tuple[str, ...] = field(default_factory=tuple)
