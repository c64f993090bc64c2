"""Quantisers: round-trip bounds, exact byte counts, error feedback, wire format."""

from __future__ import annotations

import math

import pytest
import torch

from training.engine.compression import Compressor, decode, encode, encoded_nbytes
from training.engine.config import CompressionConfig
from training.engine.messages import FragmentDelta, delta_from_bytes, delta_to_bytes

SHAPES = [(64, 256), (192, 64), (7,), (1,), (3, 5, 2)]


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(1, -1)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("kind", "qmax"), [("int8", 127), ("4bit", 7)])
def test_quantised_values_are_within_half_a_step_of_the_original(shape, kind, qmax):
    torch.manual_seed(1)
    x = torch.randn(shape) * 3e-3
    x.view(-1)[0] = 0.0
    y = decode(encode(x, kind))
    assert y.shape == x.shape and y.dtype == torch.float32
    step = _rows(x).abs().amax(dim=1, keepdim=True) / qmax * (1 + 2**-7)
    assert bool((_rows(x - y).abs() <= step / 2 + 1e-12).all())
    assert y.view(-1)[0] == 0.0


@pytest.mark.parametrize("shape", SHAPES)
def test_fp4_values_are_within_the_documented_error_of_their_e3m0_rounding(shape):
    torch.manual_seed(1)
    x = torch.randn(shape) * 3e-3
    x.view(-1)[0] = 0.0
    enc = encode(x, "fp4_e3m0")
    y = decode(enc)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert enc.scales is not None
    scale = enc.scales.float().reshape(-1, 1)
    assert bool((scale >= _rows(x).abs().amax(dim=1, keepdim=True)).all())  # rounded up: no clipping
    assert bool((scale <= _rows(x).abs().amax(dim=1, keepdim=True) * (1 + 2**-7)).all())
    # Each decoded value is 0 or ±scale·2^e with e in -6..0 (E3M0: no mantissa).
    ratio = _rows(y).abs() / scale
    nonzero = ratio[ratio > 0]
    exponents = torch.log2(nonzero)
    assert torch.equal(exponents, exponents.round()) and bool(((exponents >= -6) & (exponents <= 0)).all())
    # Relative error at most 1/3 (half the gap to the next power of two, at the cut 1.5·2^k);
    # below scale·2^-6 at most scale·2^-7 (those values go to zero or to the smallest magnitude).
    bound = torch.maximum(_rows(x).abs() / 3, scale * 2**-7)
    assert bool((_rows(x - y).abs() <= bound * (1 + 1e-6)).all())
    assert y.view(-1)[0] == 0.0


def test_fp4_rounds_to_the_nearest_magnitude_keeps_signs_and_zero():
    s = 1.0  # the row's absmax: scale 1 exactly in bf16
    x = torch.tensor([s, -s, 0.5, 0.74, 0.75, -0.76, 0.3, 2**-6, 2**-7, 0.9 * 2**-7, -(2**-7), 0.0, -0.0])
    y = decode(encode(x, "fp4_e3m0"))
    # 0.74 is nearer 0.5, 0.75 is the cut (ties go up), 0.3 is nearer 0.25; 2^-7 is the cut
    # between zero and the smallest magnitude 2^-6.
    expected = [1.0, -1.0, 0.5, 0.5, 1.0, -1.0, 0.25, 2**-6, 2**-6, 0.0, -(2**-6), 0.0, 0.0]
    assert y.tolist() == expected
    assert not bool(torch.signbit(y[-2:]).any())  # zero is always written with sign 0
    assert torch.equal(decode(encode(torch.zeros(3, 4), "fp4_e3m0")), torch.zeros(3, 4))
    # Signs survive, including in rows of mixed sign and in an odd-length tail (padding).
    z = torch.tensor([[-0.02, 0.02, -1.0], [0.5, -0.25, 0.125]])
    assert torch.equal(torch.sign(decode(encode(z, "fp4_e3m0"))), torch.sign(z))


def test_fp4_packs_two_values_per_byte_plus_a_bf16_scale_per_row():
    for shape in [(64, 256), (7,), (3, 5), (1,)]:
        rows, n = (shape[0], math.prod(shape)) if len(shape) > 1 else (1, shape[0])
        enc = encode(torch.randn(shape), "fp4_e3m0")
        assert enc.values.dtype == torch.uint8 and enc.values.numel() == math.ceil(n / 2)
        assert enc.nbytes == math.ceil(n / 2) + 2 * rows


def test_fp32_is_exact_and_bf16_is_within_its_precision():
    x = torch.randn(33, 17)
    assert torch.equal(decode(encode(x, "fp32")), x)
    y = decode(encode(x, "bf16"))
    assert bool(((x - y).abs() <= x.abs() * 2**-8).all())


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "4bit", "fp4_e3m0"])
def test_byte_counts_are_exact(kind):
    tensors = [torch.randn(s) for s in SHAPES]
    counted = sum(encode(t, kind).nbytes for t in tensors)
    dims = [(_rows(t).shape[0], _rows(t).shape[1]) for t in tensors]
    assert counted == encoded_nbytes(dims, kind)
    # Per value: 4, 2, 1 + scales, 1/2 + scales bytes.
    assert (
        encode(torch.zeros(64, 256), kind).nbytes
        == {
            "fp32": 4 * 64 * 256,
            "bf16": 2 * 64 * 256,
            "int8": 64 * 256 + 2 * 64,
            "4bit": 64 * 128 + 2 * 64,
            "fp4_e3m0": 64 * 128 + 2 * 64,
        }[kind]
    )


@pytest.mark.parametrize("kind", ["4bit", "fp4_e3m0"])
def test_error_feedback_carries_the_residual_into_the_next_round(kind):
    torch.manual_seed(2)
    xs = [torch.randn(16, 16) * 1e-3 for _ in range(50)]
    with_ef = Compressor(CompressionConfig(kind=kind, error_feedback=True))
    without = Compressor(CompressionConfig(kind=kind, error_feedback=False))
    sent_ef = sum(decode(with_ef.compress({"w": x})["w"]) for x in xs)
    sent = sum(decode(without.compress({"w": x})["w"]) for x in xs)
    truth = sum(xs)
    # With feedback the cumulative error is just the last residual (half a step);
    # without it, rounding errors add up.
    torch.testing.assert_close(truth - sent_ef, with_ef.residual["w"], rtol=0, atol=1e-7)
    assert float((truth - sent_ef).abs().max()) < float((truth - sent).abs().max())
    # Off (the default), nothing is kept between rounds.
    assert without.residual == {} and not CompressionConfig().error_feedback


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "4bit", "fp4_e3m0"])
def test_a_delta_survives_the_wire_format(kind):
    comp = Compressor(CompressionConfig(kind=kind))
    tensors = {"a.weight": torch.randn(8, 5), "a.bias": torch.randn(5)}
    d = FragmentDelta(
        learner=3,
        fragment=1,
        base_version=7,
        seq=9,
        steps=25,
        tokens=800,
        tensors=comp.compress(tensors),
        sent_at=1.5,
    )
    back = delta_from_bytes(delta_to_bytes(d))
    assert (back.id, back.base_version, back.steps, back.tokens, back.sent_at) == (d.id, 7, 25, 800, 1.5)
    assert back.nbytes == d.nbytes
    for name, t in d.decoded().items():
        assert torch.equal(back.decoded()[name], t)
