"""What crosses the wire: a learner's fragment delta, a published global version and its down-delta.

All three serialise to one self-describing tensor blob (storage.tensorblob: a JSON header and raw
tensor bytes), so the object-store transport needs neither pickle nor torch.save. ``*_parts``
give a message's (meta, tensors) for streaming it (storage.tensorblob.blob_write) and
``*_from_parts`` rebuild it from a streamed read; ``*_to_bytes`` / ``*_from_bytes`` are the same
as one byte string.
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
    # The learner's Learner.windows when it pushed: every window up to it has reached the store
    # (through this delta or an earlier one of each fragment); -1 when not known (older blobs).
    windows: int = -1

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
class DownDelta:
    """Version ``version`` of a fragment as the learners receive it: the (compressed)
    difference from version ``version − 1`` of the copy they hold (see syncer.py)."""

    fragment: int
    version: int
    tensors: dict[str, EncodedTensor]

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.tensors.values())

    def decoded(self) -> dict[str, torch.Tensor]:
        return {n: decode(e) for n, e in self.tensors.items()}


@dataclass
class GlobalVersion:
    """A published version of one fragment's global parameters, with outer-optimizer state.

    ``params`` are the syncer's exact parameters; ``mirror`` is the copy every learner holds
    (``params`` up to the down-compression error, bitwise the same in every learner); ``down``
    is what turns the mirror of version − 1 into this one. Version 0 has an empty ``down``.
    """

    fragment: int
    version: int
    params: dict[str, torch.Tensor]
    momentum: dict[str, torch.Tensor]
    merged: list[str] = field(default_factory=list)  # delta ids folded into this version
    meta: dict[str, Any] = field(default_factory=dict)
    mirror: dict[str, torch.Tensor] = field(default_factory=dict)
    down: dict[str, EncodedTensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the full fp32 parameters (what a learner without a copy downloads)."""
        return sum(t.numel() * t.element_size() for t in self.params.values())

    @property
    def held(self) -> dict[str, torch.Tensor]:
        """The learners' copy (blobs written before down-compression have none: the params)."""
        return self.mirror or self.params

    def down_delta(self) -> DownDelta:
        return DownDelta(fragment=self.fragment, version=self.version, tensors=dict(self.down))


def _encoded_tensors(
    encoded: dict[str, EncodedTensor], values: str, scales: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    kinds: dict[str, Any] = {}
    for name, e in encoded.items():
        tensors[f"{values}{name}"] = e.values
        if e.scales is not None:
            tensors[f"{scales}{name}"] = e.scales
        kinds[name] = {"kind": e.kind, "shape": list(e.shape)}
    return tensors, kinds


def _decoded_tensors(
    kinds: dict[str, Any], tensors: dict[str, torch.Tensor], values: str, scales: str
) -> dict[str, EncodedTensor]:
    return {
        name: EncodedTensor(
            k["kind"], tuple(k["shape"]), tensors[f"{values}{name}"], tensors.get(f"{scales}{name}")
        )
        for name, k in kinds.items()
    }


Parts = tuple[dict[str, Any], dict[str, torch.Tensor]]


def delta_parts(d: FragmentDelta) -> Parts:
    tensors, kinds = _encoded_tensors(d.tensors, "v:", "s:")
    meta = {
        "learner": d.learner,
        "fragment": d.fragment,
        "base_version": d.base_version,
        "seq": d.seq,
        "steps": d.steps,
        "tokens": d.tokens,
        "sent_at": d.sent_at,
        "windows": d.windows,
        "kinds": kinds,
    }
    return meta, tensors


def delta_from_parts(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> FragmentDelta:
    enc = _decoded_tensors(meta["kinds"], tensors, "v:", "s:")
    return FragmentDelta(
        learner=meta["learner"],
        fragment=meta["fragment"],
        base_version=meta["base_version"],
        seq=meta["seq"],
        steps=meta["steps"],
        tokens=meta["tokens"],
        tensors=enc,
        sent_at=meta["sent_at"],
        windows=int(meta.get("windows", -1)),
    )


def version_parts(v: GlobalVersion) -> Parts:
    tensors = {f"p:{n}": t for n, t in v.params.items()}
    tensors.update({f"m:{n}": t for n, t in v.momentum.items()})
    tensors.update({f"h:{n}": t for n, t in v.mirror.items()})
    down, down_kinds = _encoded_tensors(v.down, "dv:", "ds:")
    tensors.update(down)
    meta = {
        "fragment": v.fragment,
        "version": v.version,
        "merged": v.merged,
        "meta": v.meta,
        "down_kinds": down_kinds,
    }
    return meta, tensors


def _named(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}


def version_from_parts(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> GlobalVersion:
    return GlobalVersion(
        fragment=meta["fragment"],
        version=meta["version"],
        params=_named(tensors, "p:"),
        momentum=_named(tensors, "m:"),
        merged=list(meta["merged"]),
        meta=dict(meta["meta"]),
        mirror=_named(tensors, "h:"),
        down=_decoded_tensors(meta.get("down_kinds", {}), tensors, "dv:", "ds:"),
    )


def down_parts(d: DownDelta) -> Parts:
    tensors, kinds = _encoded_tensors(d.tensors, "v:", "s:")
    return {"fragment": d.fragment, "version": d.version, "kinds": kinds}, tensors


def down_from_parts(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> DownDelta:
    return DownDelta(
        fragment=meta["fragment"],
        version=meta["version"],
        tensors=_decoded_tensors(meta["kinds"], tensors, "v:", "s:"),
    )


def delta_to_bytes(d: FragmentDelta) -> bytes:
    return pack(*delta_parts(d))


def delta_from_bytes(blob: bytes) -> FragmentDelta:
    return delta_from_parts(*unpack(blob))


def version_to_bytes(v: GlobalVersion) -> bytes:
    return pack(*version_parts(v))


def version_from_bytes(blob: bytes) -> GlobalVersion:
    return version_from_parts(*unpack(blob))


def down_to_bytes(d: DownDelta) -> bytes:
    return pack(*down_parts(d))


def down_from_bytes(blob: bytes) -> DownDelta:
    return down_from_parts(*unpack(blob))
