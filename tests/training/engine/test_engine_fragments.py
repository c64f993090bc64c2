"""Streaming DiLoCo fragments (arXiv 2501.18512): assignment and staggered schedule."""

from __future__ import annotations

import pytest

from training.engine.config import ModelConfig
from training.engine.fragments import assign_fragments, due, offsets
from training.engine.model import build_model


@pytest.fixture(scope="module")
def params():
    model = build_model(ModelConfig(n_layer=4, n_embd=64, n_head=4, block_size=64))
    return dict(model.named_parameters())


def _blocks(names):
    return sorted({int(n.split(".")[1]) for n in names if n.startswith("blocks.")})


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("assignment", ["strided", "sequential"])
def test_every_parameter_lands_in_exactly_one_fragment(params, p, assignment):
    frags = assign_fragments(params, fragments=p, assignment=assignment)
    assert len(frags) == p
    flat = [n for f in frags for n in f]
    assert sorted(flat) == sorted(params)


def test_strided_and_sequential_assign_blocks_as_named(params):
    strided = assign_fragments(params, fragments=2, assignment="strided")
    sequential = assign_fragments(params, fragments=2, assignment="sequential")
    assert [_blocks(f) for f in strided] == [[0, 2], [1, 3]]
    assert [_blocks(f) for f in sequential] == [[0, 1], [2, 3]]


def test_embeddings_go_to_the_smaller_fragment_so_the_peak_stays_near_s_over_p(params):
    frags = assign_fragments(params, fragments=2)
    sizes = [sum(params[n].numel() for n in f) for f in frags]
    total = sum(p.numel() for p in params.values())
    assert max(sizes) <= 0.55 * total


def test_fragment_p_syncs_when_t_minus_its_offset_is_a_multiple_of_h():
    h, p = 10, 2
    offs = offsets(p, h)
    assert offs == [0, 5]
    schedule = {t: due(t, h=h, fragment_offsets=offs) for t in range(0, 31)}
    assert [t for t, fs in schedule.items() if 0 in fs] == [10, 20, 30]
    assert [t for t, fs in schedule.items() if 1 in fs] == [5, 15, 25]
    # Staggered: never two fragments on the same step.
    assert all(len(fs) <= 1 for fs in schedule.values())


def test_one_fragment_is_plain_diloco_every_h_steps():
    assert [t for t in range(1, 76) if due(t, h=25, fragment_offsets=offsets(1, 25))] == [25, 50, 75]
