"""The tensor blob: a JSON header and raw little-endian tensor bytes, no pickle.

Layout: b"SYD1", a 4-byte little-endian header length, the JSON header
({"meta": ..., "tensors": [{"name", "dtype", "shape", "n"}, ...]}), then each tensor's bytes in
order. Loading a blob never runs code. The engine's deltas and global versions and the model
artifacts use it.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

_MAGIC = b"SYD1"
_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
}


def _raw(t: torch.Tensor) -> bytes:
    flat = t.detach().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def pack(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> bytes:
    """One blob of `meta` (JSON-serialisable) and the tensors, in the order given."""
    index = []
    chunks = []
    for name, t in tensors.items():
        raw = _raw(t)
        index.append(
            {
                "name": name,
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "n": len(raw),
            }
        )
        chunks.append(raw)
    header = json.dumps({"meta": meta, "tensors": index}).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + b"".join(chunks)


def unpack(blob: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(meta, tensors) of a blob that `pack` wrote; ValueError for anything else."""
    if blob[:4] != _MAGIC:
        raise ValueError("not a Switchyard tensor blob")
    (hlen,) = struct.unpack("<I", blob[4:8])
    header = json.loads(blob[8 : 8 + hlen])
    pos = 8 + hlen
    tensors: dict[str, torch.Tensor] = {}
    for item in header["tensors"]:
        raw = bytearray(blob[pos : pos + item["n"]])
        pos += item["n"]
        u8 = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        tensors[item["name"]] = u8.view(_DTYPES[item["dtype"]]).reshape(item["shape"]).clone()
    return header["meta"], tensors
