"""What the DiLoCo benchmark runs: its profiles (quick and full: model, batch, steps, targets) and
the specs of each run, the core comparisons and the sweeps."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from training.engine.config import (
    CompressionKind,
    DataConfig,
    InnerConfig,
    ModelConfig,
    OuterConfig,
)
from training.engine.simulator import (
    Mode,
)


@dataclass(frozen=True)
class Profile:
    name: str
    model: ModelConfig
    data: DataConfig
    steps: int  # inner steps per learner (Protocol A/B runs)
    batch: int  # B, the global batch of the data-parallel baseline
    h: int
    inner: InnerConfig
    outer: OuterConfig
    eval_windows: int
    fragments: int  # P for the streaming run
    event_steps: int  # steps of the straggler / failure runs (per normal-speed learner)
    overhead_steps: int
    sweep_h: tuple[int, ...] = ()
    sweep_m: tuple[int, ...] = ()
    sweep_outer_lr: tuple[float, ...] = ()
    seed: int = 0


def profile_named(name: str) -> Profile:
    if name == "smoke":  # for the test-suite: every code path, seconds of compute
        return Profile(
            name=name,
            model=ModelConfig(n_layer=2, n_embd=32, n_head=2, block_size=32),
            data=DataConfig(max_train_bytes=300_000, max_eval_bytes=60_000),
            steps=20,
            batch=8,
            h=5,
            inner=InnerConfig(lr=3e-3, warmup_steps=4, total_steps=20),
            outer=OuterConfig(),
            eval_windows=32,
            fragments=2,
            event_steps=20,
            overhead_steps=4,
        )
    quick = Profile(
        name="quick",
        model=ModelConfig(n_layer=4, n_embd=64, n_head=4, block_size=64),
        data=DataConfig(max_train_bytes=4_000_000, max_eval_bytes=400_000),
        steps=500,
        batch=32,
        # Inner lr 1e-3 for every method (as the DiLoCo paper does, one inner lr for the
        # baseline and DiLoCo). docs/training-engine.md shows how the ratios move with it: data-parallel
        # alone prefers a higher lr here, and DiLoCo's gap grows with the lr.
        h=25,
        inner=InnerConfig(lr=1e-3, warmup_steps=50, total_steps=500),
        outer=OuterConfig(lr=0.7, momentum=0.9),
        eval_windows=1024,
        fragments=2,
        event_steps=500,
        overhead_steps=10,
    )
    if name == "quick":
        return quick
    return replace(
        quick, name="full", sweep_h=(10, 25, 50, 100), sweep_m=(1, 2, 4, 8), sweep_outer_lr=(0.5, 0.7)
    )


@dataclass(frozen=True)
class RunSpec:
    name: str
    method: str  # data_parallel | diloco | streaming | decoupled
    m: int = 1
    batch_per_learner: int = 32
    h: int = 0
    fragments: int = 1
    outer_lr: float = 0.7
    compression: CompressionKind = "fp32"
    mode: Mode = "barrier"
    overlap: int = 0
    alpha: float = 0.0
    slow: tuple[float, ...] = ()  # per-learner step-time multipliers (default 1)
    fail: tuple[tuple[int, float, float], ...] = ()  # (learner, from, to) in virtual seconds
    time_limit: float | None = None
    steps: int | None = None
    quorum: int | None = None
    grace: float = 0.0
    constant_lr: bool = False
    eval_every: int = 0
    tags: dict[str, Any] = field(default_factory=dict)


def core_specs(p: Profile) -> list[RunSpec]:
    b, h, p_frag = p.batch, p.h, p.fragments
    ev = p.event_steps
    slow = (1.0, 1.0, 1.0, 2.0)
    event_time = float(ev)  # virtual seconds: one normal-speed step is one second
    return [
        RunSpec("dp_b", "data_parallel", batch_per_learner=b),
        # Equal compute with Protocol A (4 learners of batch B): one worker of batch 4·B.
        RunSpec("dp_4b", "data_parallel", batch_per_learner=4 * b),
        RunSpec("diloco_m2_fp32", "diloco", m=2, batch_per_learner=b // 2, h=h),
        RunSpec("diloco_m4", "diloco", m=4, batch_per_learner=b // 4, h=h),
        RunSpec("diloco_m4_protocol_a", "diloco", m=4, batch_per_learner=b, h=h),
        RunSpec("diloco_m2_int8", "diloco", m=2, batch_per_learner=b // 2, h=h, compression="int8"),
        RunSpec("diloco_m2_4bit", "diloco", m=2, batch_per_learner=b // 2, h=h, compression="4bit"),
        # Streaming DiLoCo's FP4 (E3M0) beside uniform int4, both ways, no learner error feedback.
        RunSpec("diloco_m2_fp4", "diloco", m=2, batch_per_learner=b // 2, h=h, compression="fp4_e3m0"),
        RunSpec(
            f"streaming_m2_p{p_frag}",
            "streaming",
            m=2,
            batch_per_learner=b // 2,
            h=h,
            fragments=p_frag,
            overlap=1,
            alpha=0.5,
        ),
        RunSpec(
            "straggler_barrier",
            "diloco",
            m=4,
            batch_per_learner=b // 4,
            h=h,
            slow=slow,
            constant_lr=True,
            steps=ev,
            eval_every=1,
        ),
        # Decoupled: quorum 3 of 4, a grace of one step; runs as long as the barrier run.
        RunSpec(
            "straggler_decoupled",
            "decoupled",
            m=4,
            batch_per_learner=b // 4,
            h=h,
            slow=slow,
            mode="decoupled",
            quorum=3,
            grace=1.0,
            constant_lr=True,
            time_limit=2 * event_time + 10.0,
            eval_every=1,
        ),
        RunSpec(
            "failure_free",
            "decoupled",
            m=4,
            batch_per_learner=b // 4,
            h=h,
            mode="decoupled",
            quorum=3,
            grace=1.0,
            time_limit=event_time,
            tags={"goodput": True},
        ),
        RunSpec(
            "failure_quarter",
            "decoupled",
            m=4,
            batch_per_learner=b // 4,
            h=h,
            mode="decoupled",
            quorum=3,
            grace=1.0,
            time_limit=event_time,
            fail=((3, event_time / 4, event_time / 2),),
            tags={"goodput": True},
        ),
    ]


def sweep_specs(p: Profile) -> list[RunSpec]:
    out = []
    for m in p.sweep_m:
        for hh in p.sweep_h:
            for lr in p.sweep_outer_lr:
                out.append(
                    RunSpec(
                        f"sweep_m{m}_h{hh}_lr{lr}",
                        "diloco",
                        m=m,
                        batch_per_learner=max(1, p.batch // m),
                        h=hh,
                        outer_lr=lr,
                        tags={"sweep": True},
                    )
                )
    return out
