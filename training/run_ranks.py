"""A learner chunk's other ranks, for runs whose learners are process groups (learners.ranks > 1),
data-parallel (DDP) or sharded (FSDP2, learners.sharding: fsdp).

The chunk's own process is rank 0 (training.orchestrator); ranks 1..N-1 are helper processes
that training.engine.distributed starts for the learner's first chunk in this process and keeps
for its next ones (the key: run, learner, generation), until the run ends here
(``learner_ranks_release``), the learner moves, a chunk fails or the group idles out. This
module only names the group and tells the ranks what to read: each rank's sampler recipe, from
the run's engine objects (training.run_engines.sampler_spec). No database access here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from training.run_engines import RunEngine, RunKey, sampler_spec

if TYPE_CHECKING:
    import torch

    from training.engine.distributed import LeaderGroup
    from training.engine.learner import Learner


def chunk_devices(owned: list[int]) -> list[torch.device] | None:
    """Where a chunk's ranks run: rank r on CUDA device `owned[r]`, the ordinals its worker let
    it own (training.services.chunks); None (the learner's default device, rank r on CUDA device
    r) on a worker that offers none or without CUDA."""
    import torch  # noqa: PLC0415 (the web process imports this module without torch)

    if not owned or not torch.cuda.is_available():
        return None
    return [torch.device("cuda", d) for d in owned]


def learner_device(engine: RunEngine, devices: list[torch.device] | None) -> torch.device | None:
    """Where the chunk's learner (rank 0's whole state) lives: on the host for a sharded run
    (``learners.sharding: fsdp``; its shards train on ``devices``), else on rank 0's device
    (None: the default one)."""
    import torch  # noqa: PLC0415 (the web process imports this module without torch)

    if engine.rc.ranks > 1 and engine.rc.sharding == "fsdp":
        return torch.device("cpu")
    return devices[0] if devices else None


def learner_ranks_start(
    *,
    run: RunKey,
    engine: RunEngine,
    learner: Learner,
    index: int,
    generation: int,
    steps_done: int,
    devices: list[torch.device] | None = None,
) -> LeaderGroup | None:
    """Begin a session of the learner's ranks 1..N-1 with this process as rank 0 (the group
    kept from its previous chunk here, or one started now); None for a one-rank learner.

    A rank whose sampler position the learner kept (``Learner.rank_samplers``: the previous
    chunk's, or its checkpoint's) continues from it; the others start their stream as rank 0's
    did (a fresh byte stream per generation, or the text shard past ``steps_done`` steps).
    Raises training.engine.distributed.RankError when a rank does not start.
    """
    ranks = engine.rc.ranks
    if ranks <= 1:
        return None
    from training.engine.distributed import group_start  # lazily: imports torch

    specs = []
    for rank in range(1, ranks):
        saved = rank in learner.rank_samplers
        meta, tensors = sampler_spec(
            engine, index=index, generation=generation, steps_done=0 if saved else steps_done, rank=rank
        )
        specs.append((meta, tensors))
    return group_start(
        learner, samplers=specs, devices=devices, key=(run, index, generation), sharding=engine.rc.sharding
    )


def learner_ranks_release(run: RunKey, index: int | None = None) -> None:
    """End the rank group this process kept for the run (for its learner ``index`` only, when
    given), if any: the run is over here, or a chunk of that learner failed."""
    if "training.engine.distributed" not in sys.modules:
        return  # no group was ever started here (and the web process never imports torch)
    from training.engine.distributed import group_release

    group_release(lambda key: key[0] == run and (index is None or key[1] == index))
