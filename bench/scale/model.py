"""The drill's synthetic model: transformer-shaped fp32 tensors of a requested size, no network.

Per block (named ``blocks.N.`` as the byte GPT names them, so training.engine.fragments splits
them like a real model): two norms [d], attention q, k, v, o [d, d], an MLP up [4d, d] and
down [d, 4d], 12·d² + 2·d values; around the blocks a tied embedding [V, d] and a final norm.
The width follows the usual depth-to-width ratio (layers ≈ d / 128), so 1e9 gives d = 2176 and
16 blocks, close to the 1B-class open models; the vocabulary (32000) is halved until the
embedding is at most a quarter of the model, so tiny drills still have blocks to split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.engine.fragments import assign_fragments

VOCAB = 32_000
INIT_STD = 0.02


@dataclass(frozen=True)
class Shapes:
    """Parameter names and shapes, in model order, and the geometry that made them."""

    tensors: dict[str, tuple[int, ...]]
    d_model: int
    layers: int
    vocab: int

    @property
    def params(self) -> int:
        return sum(numel(s) for s in self.tensors.values())

    @property
    def fp32_bytes(self) -> int:
        return 4 * self.params


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def synthetic_shapes(params: float) -> Shapes:
    """Shapes of a decoder with about ``params`` parameters (at least one block of width 64)."""
    d = max(64, round((params * 128 / 12) ** (1 / 3) / 64) * 64)
    vocab = VOCAB
    while vocab * d > params / 4 and vocab > 256:
        vocab //= 2
    per_block = 12 * d * d + 2 * d
    layers = max(1, round((params - vocab * d - d) / per_block))
    tensors: dict[str, tuple[int, ...]] = {"embed.weight": (vocab, d)}
    for i in range(layers):
        b = f"blocks.{i}."
        tensors[b + "ln1.weight"] = (d,)
        for proj in ("q", "k", "v", "o"):
            tensors[f"{b}attn.{proj}.weight"] = (d, d)
        tensors[b + "ln2.weight"] = (d,)
        tensors[b + "mlp.up.weight"] = (4 * d, d)
        tensors[b + "mlp.down.weight"] = (d, 4 * d)
    tensors["norm.weight"] = (d,)
    return Shapes(tensors=tensors, d_model=d, layers=layers, vocab=vocab)


def fragments_of(shapes: Shapes, count: int) -> list[list[str]]:
    """The names per fragment as a real run splits them (strided), on meta tensors (no memory)."""
    meta = {n: torch.empty(s, device="meta") for n, s in shapes.tensors.items()}
    return assign_fragments(meta, fragments=count, assignment="strided")


def initial_params(shapes: Shapes, seed: int) -> dict[str, torch.Tensor]:
    """The syncer's version 0: N(0, 0.02²) per tensor from one seeded generator (norms at one)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.tensors.items():
        if len(shape) == 1:
            out[name] = torch.ones(shape)
        else:
            out[name] = torch.empty(shape).normal_(0.0, INIT_STD, generator=gen)
    return out
