"""Streaming DiLoCo fragments and their staggered schedule (arXiv 2501.18512, sec. 2.2).

The transformer blocks are split into P fragments, either ``strided`` (block i goes to
fragment i mod P, the paper's preferred choice) or ``sequential`` (P contiguous runs of
blocks). Parameters outside the blocks (embeddings, final norm) go, largest first, to
whichever fragment is smallest so far, which keeps the per-sync peak near S / P.

Fragment p syncs after inner steps t with t > 0 and (t - offset_p) mod H == 0, where
offset_p = p * H // P: the syncs of different fragments are spread evenly over the H steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from training.engine.config import Assignment

# A transformer block's parameters: the byte GPT's ``blocks.N.``, GPT-2's ``h.N.`` and Llama's
# ``model.layers.N.``.
_BLOCK = re.compile(r"^(?:blocks|h|model\.layers)\.(\d+)\.")


def assign_fragments(
    params: Mapping[str, torch.Tensor], *, fragments: int, assignment: Assignment = "strided"
) -> list[list[str]]:
    """Parameter names per fragment, in model order within each fragment."""
    if fragments < 1:
        raise ValueError("fragments must be >= 1")
    names = list(params)
    if fragments == 1:
        return [names]
    blocks = sorted({int(m.group(1)) for n in names if (m := _BLOCK.match(n))})
    if len(blocks) < fragments:
        raise ValueError(f"{len(blocks)} blocks cannot make {fragments} fragments")
    owner: dict[int, int] = {}
    for i, b in enumerate(blocks):
        if assignment == "strided":
            owner[b] = i % fragments
        else:
            owner[b] = i * fragments // len(blocks)
    out: list[list[str]] = [[] for _ in range(fragments)]
    sizes = [0] * fragments
    for n in names:
        m = _BLOCK.match(n)
        if m:
            f = owner[int(m.group(1))]
            out[f].append(n)
            sizes[f] += params[n].numel()
    rest = sorted((n for n in names if not _BLOCK.match(n)), key=lambda n: -params[n].numel())
    for n in rest:
        f = min(range(fragments), key=lambda i: (sizes[i], i))
        out[f].append(n)
        sizes[f] += params[n].numel()
    order = {n: i for i, n in enumerate(names)}
    return [sorted(f, key=order.__getitem__) for f in out]


def offsets(fragments: int, h: int) -> list[int]:
    """offset_p = p * H // P for each fragment p."""
    return [p * h // fragments for p in range(fragments)]


def due(step: int, *, h: int, fragment_offsets: list[int]) -> list[int]:
    """Fragments that sync right after inner step ``step`` (1-based)."""
    if step <= 0:
        return []
    return [p for p, off in enumerate(fragment_offsets) if step >= off and (step - off) % h == 0]
