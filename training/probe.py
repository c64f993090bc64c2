"""The probe job's training loop: pure torch, no Django.

A probe proves that a cluster's workers can run torch work end to end: a tiny
byte-level next-byte model trained with AdamW for a few hundred steps on the
Python standard library's own source files (present on every machine).
"""

from __future__ import annotations

import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProbeConfig:
    steps: int = 300
    batch_size: int = 32
    context: int = 16
    embed_dim: int = 32
    hidden_dim: int = 128
    lr: float = 3e-3
    corpus_bytes: int = 256 * 1024
    report_every: int = 10
    seed: int = 0


@dataclass(frozen=True)
class ProbeResult:
    loss_curve: list[tuple[int, float]]
    final_loss: float
    wall_seconds: float
    device: str
    parameter_count: int


def stdlib_corpus(max_bytes: int) -> bytes:
    """Bytes of stdlib .py files in sorted path order (deterministic per Python version)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def run_probe(config: ProbeConfig, on_progress: Callable[[int, float], None] | None = None) -> ProbeResult:
    # Lazily: the web process imports this module (through training.services) without torch.
    import torch
    from torch import nn

    torch.manual_seed(config.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = torch.frombuffer(bytearray(stdlib_corpus(config.corpus_bytes)), dtype=torch.uint8)
    data = data.to(device=device, dtype=torch.long)

    model = nn.Sequential(
        nn.Embedding(256, config.embed_dim),
        nn.Flatten(),
        nn.Linear(config.context * config.embed_dim, config.hidden_dim),
        nn.GELU(),
        nn.Linear(config.hidden_dim, 256),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    generator = torch.Generator(device="cpu").manual_seed(config.seed)
    curve: list[tuple[int, float]] = []
    loss_value = float("nan")
    started = time.perf_counter()
    for step in range(1, config.steps + 1):
        starts = torch.randint(
            0, data.numel() - config.context - 1, (config.batch_size,), generator=generator
        ).to(device)
        offsets = torch.arange(config.context, device=device)
        x = data[starts[:, None] + offsets]
        y = data[starts + config.context]
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = float(loss.item())
        if step == 1 or step % config.report_every == 0 or step == config.steps:
            curve.append((step, round(loss_value, 5)))
            if on_progress is not None:
                on_progress(step, loss_value)
    return ProbeResult(
        loss_curve=curve,
        final_loss=loss_value,
        wall_seconds=time.perf_counter() - started,
        device=device,
        parameter_count=sum(p.numel() for p in model.parameters()),
    )
