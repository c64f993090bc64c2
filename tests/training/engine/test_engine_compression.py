"""Quantisers: round-trip bounds, exact byte counts, error feedback, wire format."""

from __future__ import annotations

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


def test_fp32_is_exact_and_bf16_is_within_its_precision():
    x = torch.randn(33, 17)
    assert torch.equal(decode(encode(x, "fp32")), x)
    y = decode(encode(x, "bf16"))
    assert bool(((x - y).abs() <= x.abs() * 2**-8).all())


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "4bit"])
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
        }[kind]
    )


def test_error_feedback_carries_the_residual_into_the_next_round():
    torch.manual_seed(2)
    xs = [torch.randn(16, 16) * 1e-3 for _ in range(50)]
    with_ef = Compressor(CompressionConfig(kind="4bit", error_feedback=True))
    without = Compressor(CompressionConfig(kind="4bit", error_feedback=False))
    sent_ef = sum(decode(with_ef.compress({"w": x})["w"]) for x in xs)
    sent = sum(decode(without.compress({"w": x})["w"]) for x in xs)
    truth = sum(xs)
    # With feedback the cumulative error is just the last residual (half a step);
    # without it, rounding errors add up.
    torch.testing.assert_close(truth - sent_ef, with_ef.residual["w"], rtol=0, atol=1e-7)
    assert float((truth - sent_ef).abs().max()) < float((truth - sent).abs().max())


@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8", "4bit"])
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
