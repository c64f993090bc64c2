"""Compression of outer gradients (Δ), after Streaming DiLoCo (arXiv 2501.18512, sec. 2.4).

Kinds: ``fp32`` (4 B/value), ``bf16`` (2 B/value), ``int8`` with one absmax scale per row
(1 B/value + 2 B/row) and ``4bit`` with one absmax scale per row (two values per byte +
2 B/row). A "row" is the first dimension of a weight matrix; a vector is one row. Scales are
stored in bf16, rounded *up* so that no value is clipped. Whatever travels, the receiver
dequantises to fp32 and sums in fp32 (the paper quantises the communication, never the
accumulation).

Round-trip bound: for int8 and 4bit, every element is within half a quantisation step,
``|x - decode(encode(x))| <= scale / 2`` with ``scale = absmax(row) / qmax * (1 + 2**-7)``
(qmax 127 and 7), and zero stays zero.

Error feedback (optional) keeps the quantisation residual per tensor and adds it to the next
Δ before quantising, so no part of the update is lost for good.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from training.engine.config import CompressionConfig, CompressionKind

_QMAX = {"int8": 127, "4bit": 7}


@dataclass(frozen=True)
class EncodedTensor:
    kind: CompressionKind
    shape: tuple[int, ...]
    values: torch.Tensor  # fp32 / bf16 / int8 / packed uint8
    scales: torch.Tensor | None  # bf16, one per row, for int8 and 4bit

    @property
    def nbytes(self) -> int:
        """Exact payload bytes: the values plus the scales (no header)."""
        n = self.values.numel() * self.values.element_size()
        if self.scales is not None:
            n += self.scales.numel() * self.scales.element_size()
        return n


def _rows(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().float().reshape(t.shape[0], -1) if t.dim() >= 2 else t.detach().float()
    return flat.reshape(1, -1) if flat.dim() == 1 else flat


def _round_up_bf16(x: torch.Tensor) -> torch.Tensor:
    """bf16 of x (x >= 0), nudged one ulp up wherever rounding went down."""
    y = x.to(torch.bfloat16)
    low = y.float() < x
    if bool(low.any()):
        bumped = (y.view(torch.int16) + 1).view(torch.bfloat16)
        y = torch.where(low, bumped, y)
    return y


def encode(t: torch.Tensor, kind: CompressionKind) -> EncodedTensor:
    shape = tuple(t.shape)
    if kind == "fp32":
        return EncodedTensor(kind, shape, t.detach().float().reshape(-1).clone(), None)
    if kind == "bf16":
        return EncodedTensor(kind, shape, t.detach().to(torch.bfloat16).reshape(-1), None)
    qmax = _QMAX[kind]
    rows = _rows(t)
    absmax = rows.abs().amax(dim=1)
    scales = _round_up_bf16(absmax / qmax)
    s = scales.float().clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(1)
    q = torch.round(rows / s).clamp_(-qmax, qmax).to(torch.int8)
    if kind == "int8":
        return EncodedTensor(kind, shape, q.reshape(-1), scales)
    # 4 bit: levels -7..7 stored as 1..15, two per byte (low nibble first).
    u = (q.reshape(-1) + 8).to(torch.uint8)
    if u.numel() % 2:
        u = torch.cat([u, torch.full((1,), 8, dtype=torch.uint8)])
    packed = u[0::2] | (u[1::2] << 4)
    return EncodedTensor(kind, shape, packed, scales)


def decode(e: EncodedTensor) -> torch.Tensor:
    """fp32 tensor of the original shape."""
    if e.kind in ("fp32", "bf16"):
        return e.values.float().reshape(e.shape)
    if e.scales is None:
        raise ValueError(f"{e.kind} tensor without scales")
    numel = math.prod(e.shape)
    if e.kind == "int8":
        q = e.values.float()
    else:
        lo = (e.values & 0x0F).to(torch.int16) - 8
        hi = (e.values >> 4).to(torch.int16) - 8
        q = torch.stack([lo, hi], dim=1).reshape(-1)[:numel].float()
    rows = q.reshape(e.scales.numel(), -1) * e.scales.float().unsqueeze(1)
    return rows.reshape(e.shape)


def encoded_nbytes(numel_per_row: list[tuple[int, int]], kind: CompressionKind) -> int:
    """Payload bytes for tensors given as (rows, cols), without encoding anything."""
    total = 0
    for rows, cols in numel_per_row:
        n = rows * cols
        if kind == "fp32":
            total += 4 * n
        elif kind == "bf16":
            total += 2 * n
        elif kind == "int8":
            total += n + 2 * rows
        else:
            total += (n + 1) // 2 + 2 * rows
    return total


class Compressor:
    """Encodes named tensors of one sender, with optional error feedback per tensor."""

    def __init__(self, cfg: CompressionConfig) -> None:
        self.cfg = cfg
        self.residual: dict[str, torch.Tensor] = {}

    def compress(self, tensors: dict[str, torch.Tensor]) -> dict[str, EncodedTensor]:
        out: dict[str, EncodedTensor] = {}
        for name, t in tensors.items():
            x = t.detach().float()
            if self.cfg.error_feedback and name in self.residual:
                x = x + self.residual[name]
            enc = encode(x, self.cfg.kind)
            if self.cfg.error_feedback and self.cfg.kind != "fp32":
                self.residual[name] = x - decode(enc)
            out[name] = enc
        return out

    def reset(self) -> None:
        self.residual.clear()
