"""Samplers for the tests of a learner as a process group (DDP, FSDP2, NCCL): a rank's byte
sampler recipe, and one sampler drawing what two ranks draw together (the same global batch)."""

from __future__ import annotations

import torch

from training.engine.data import BatchSampler

SamplerSpec = tuple[dict[str, object], dict[str, torch.Tensor]]


def bytes_spec(data: torch.Tensor, *, block_size: int, batch_size: int, seed: int) -> SamplerSpec:
    """The recipe a helper rank builds its byte sampler from (run_engines.sampler_spec's shape)."""
    return {"kind": "bytes", "block_size": block_size, "batch_size": batch_size, "seed": seed}, {"data": data}


class UnionSampler:
    """One rank drawing what ranks seeded ``seeds`` draw together, batch by batch."""

    def __init__(
        self, data: torch.Tensor, *, block_size: int, batch_size: int, seeds: tuple[int, ...]
    ) -> None:
        self.parts = [BatchSampler(data, block_size=block_size, batch_size=batch_size, seed=s) for s in seeds]
        self.batch_size, self.block_size = batch_size * len(seeds), block_size

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = zip(*(p.next() for p in self.parts), strict=True)
        return torch.cat(xs), torch.cat(ys)
