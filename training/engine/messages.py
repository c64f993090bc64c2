"""What crosses the wire: a learner's fragment delta and a published global version.

Both serialise to one self-describing tensor blob (storage.tensorblob: a JSON header and raw
tensor bytes), so the object-store transport needs neither pickle nor torch.save.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from storage.tensorblob import pack, unpack
from training.engine.compression import EncodedTensor, decode


@dataclass
class FragmentDelta:
    """Δ = θ_global − θ_local for one fragment, with the metadata the syncer weighs it by."""

    learner: int
    fragment: int
    base_version: int  # the fragment's global version this Δ was computed against
    seq: int  # per-learner counter; (learner, fragment, seq) names the delta
    steps: int  # inner steps behind this Δ
    tokens: int  # tokens behind this Δ
    tensors: dict[str, EncodedTensor]
    sent_at: float = 0.0  # virtual or real seconds

    @property
    def id(self) -> str:
        return f"l{self.learner:04d}-f{self.fragment:03d}-s{self.seq:08d}"

    @property
    def nbytes(self) -> int:
        """Payload bytes of the (possibly compressed) tensors."""
        return sum(e.nbytes for e in self.tensors.values())

    def decoded(self) -> dict[str, torch.Tensor]:
        return {n: decode(e) for n, e in self.tensors.items()}


@dataclass
class GlobalVersion:
    """A published version of one fragment's global parameters, with outer-optimizer state."""

    fragment: int
    version: int
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    merged: list[str] = field(default_factory=list)  # delta ids folded into this version
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.params.values())


def delta_to_bytes(d: FragmentDelta) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    kinds: dict[str, Any] = {}
    for name, e in d.tensors.items():
        tensors[f"v:{name}"] = e.values
        if e.scales is not None:
            tensors[f"s:{name}"] = e.scales
        kinds[name] = {"kind": e.kind, "shape": list(e.shape)}
    meta = {
        "learner": d.learner,
        "fragment": d.fragment,
        "base_version": d.base_version,
        "seq": d.seq,
        "steps": d.steps,
        "tokens": d.tokens,
        "sent_at": d.sent_at,
        "kinds": kinds,
    }
    return pack(meta, tensors)


def delta_from_bytes(blob: bytes) -> FragmentDelta:
    meta, tensors = unpack(blob)
    enc = {
        name: EncodedTensor(k["kind"], tuple(k["shape"]), tensors[f"v:{name}"], tensors.get(f"s:{name}"))
        for name, k in meta["kinds"].items()
    }
    return FragmentDelta(
        learner=meta["learner"],
        fragment=meta["fragment"],
        base_version=meta["base_version"],
        seq=meta["seq"],
        steps=meta["steps"],
        tokens=meta["tokens"],
        tensors=enc,
        sent_at=meta["sent_at"],
    )


def version_to_bytes(v: GlobalVersion) -> bytes:
    tensors = {f"p:{n}": t for n, t in v.params.items()}
    tensors.update({f"m:{n}": t for n, t in v.momentum.items()})
    meta = {"fragment": v.fragment, "version": v.version, "merged": v.merged, "meta": v.meta}
    return pack(meta, tensors)


def version_from_bytes(blob: bytes) -> GlobalVersion:
    meta, tensors = unpack(blob)
    return GlobalVersion(
        fragment=meta["fragment"],
        version=meta["version"],
        params={k[2:]: t for k, t in tensors.items() if k.startswith("p:")},
        momentum={k[2:]: t for k, t in tensors.items() if k.startswith("m:")},
        merged=list(meta["merged"]),
        meta=dict(meta["meta"]),
    )
