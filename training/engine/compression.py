"""Compression of outer gradients (Δ), after Streaming DiLoCo (arXiv 2501.18512, sec. 2.4).

Kinds: ``fp32`` (4 B/value), ``bf16`` (2 B/value), ``int8`` with one absmax scale per row
(1 B/value + 2 B/row), ``4bit`` (uniform int4) with one absmax scale per row (two values per
byte + 2 B/row) and ``fp4_e3m0``, the paper's FP4 (sign and 3 exponent bits, no mantissa:
values ±s·2^e, see below), packed and scaled like ``4bit``. A "row" is the first dimension of a
weight matrix; a vector is one row. Scales are stored in bf16, rounded *up* so that no value is
clipped. Whatever travels, the receiver dequantises to fp32 and sums in fp32 (the paper
quantises the communication, never the accumulation).

Round-trip bound: for int8 and 4bit, every element is within half a quantisation step,
``|x - decode(encode(x))| <= scale / 2`` with ``scale = absmax(row) / qmax * (1 + 2**-7)``
(qmax 127 and 7), and zero stays zero. For fp4_e3m0,
``|x - decode(encode(x))| <= max(|x| / 3, scale * 2**-7)`` with ``scale = absmax(row) * (1 + 2**-7)``.

Error feedback (optional) keeps the quantisation residual per tensor and adds it to the next
Δ before quantising, so no part of the update is lost for good.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from training.engine.config import CompressionConfig, CompressionKind

# The largest level of each quantised kind: a row's absmax maps onto it (fp4_e3m0: 2**0).
_QMAX = {"int8": 127, "4bit": 7, "fp4_e3m0": 1}

# FP4 E3M0 (arXiv 2501.18512 sec. 2.4 sends outer gradients as 4-bit floats with 1 sign bit,
# 3 exponent bits and 0 mantissa bits, and accumulates in fp32). The paper gives no bias or zero
# convention; ours, relative to the row's scale s: a nibble is ``sign << 3 | code``; code 0 is
# zero (the subnormal slot, which without a mantissa holds only zero; always written with sign
# 0, so -0.0 and tiny negatives come back as +0.0); code c in 1..7 is ±s·2**(c - 7). The 15
# values are thus 0 and ±s·{2**-6, 2**-5, ..., 2**-1, 1}, and the row's absmax lands on ±s.
# Rounding is to the nearest representable value in linear space (IEEE's round-to-nearest, a
# tie going to the larger magnitude): between 2**k and 2**(k+1) the cut is 1.5·2**k, between 0
# and 2**-6 it is 2**-7. The error is largest just below a cut, 0.5·2**k out of 1.5·2**k, so
# |x - x̂| <= |x| / 3 from s·2**-6 up, and at most s·2**-7 below it.
_E3M0_MAGNITUDES = torch.tensor([0.0] + [2.0**e for e in range(-6, 1)])  # indexed by code
_E3M0_CUTS = (_E3M0_MAGNITUDES[:-1] + _E3M0_MAGNITUDES[1:]) / 2


@dataclass(frozen=True)
class EncodedTensor:
    kind: CompressionKind
    shape: tuple[int, ...]
    values: torch.Tensor  # fp32 / bf16 / int8 / packed uint8
    scales: torch.Tensor | None  # bf16, one per row, for int8, 4bit and fp4_e3m0

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
    if kind == "fp4_e3m0":
        y = rows / s
        # right=True: a value on a cut counts as above it (ties to the larger magnitude).
        code = torch.bucketize(y.abs(), _E3M0_CUTS.to(y.device), right=True).to(torch.uint8)
        sign = ((y < 0) & (code > 0)).to(torch.uint8)
        return EncodedTensor(kind, shape, _pack_nibbles(code | (sign << 3), pad=0), scales)
    q = torch.round(rows / s).clamp_(-qmax, qmax).to(torch.int8)
    if kind == "int8":
        return EncodedTensor(kind, shape, q.reshape(-1), scales)
    # 4 bit: levels -7..7 stored as 1..15 (8 is zero).
    return EncodedTensor(kind, shape, _pack_nibbles((q + 8).to(torch.uint8), pad=8), scales)


def _pack_nibbles(u: torch.Tensor, *, pad: int) -> torch.Tensor:
    """Two 4-bit values per byte, low nibble first; an odd count is padded with ``pad``."""
    u = u.reshape(-1)
    if u.numel() % 2:
        u = torch.cat([u, torch.full((1,), pad, dtype=torch.uint8, device=u.device)])
    return u[0::2] | (u[1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor, numel: int) -> torch.Tensor:
    return torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[:numel]


def decode(e: EncodedTensor) -> torch.Tensor:
    """fp32 tensor of the original shape."""
    if e.kind in ("fp32", "bf16"):
        return e.values.float().reshape(e.shape)
    if e.scales is None:
        raise ValueError(f"{e.kind} tensor without scales")
    numel = math.prod(e.shape)
    if e.kind == "int8":
        q = e.values.float()
    elif e.kind == "fp4_e3m0":
        nib = _unpack_nibbles(e.values, numel)
        mag = _E3M0_MAGNITUDES.to(nib.device)[(nib & 0x07).long()]
        q = torch.where((nib & 0x08).bool(), -mag, mag)
    else:
        q = _unpack_nibbles(e.values, numel).float() - 8
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
        else:  # 4bit, fp4_e3m0
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
