"""A learner as a process group: N ranks train one replica each, data-parallel (DDP) inside it,
or, with ``learners.sharding: fsdp``, one replica sharded over them (FSDP2: see
training.engine.distributed.sharding, whose outer step works on the shards).

DiLoCo runs across learners as before; inside a learner, its inner steps are split over N
ranks with ``torch.distributed`` (gloo on CPU, NCCL on CUDA) and
``torch.nn.parallel.DistributedDataParallel``, which averages the ranks' gradients in the
backward pass (PyTorch docs, "DistributedDataParallel"). Each rank draws ``batch / N`` windows
from its own shard, so a step of N ranks is a step of the learner's whole batch.

Rank 0 is the process that runs the chunk (the Celery worker): it alone fetches global
versions, pushes deltas, adopts versions and writes the checkpoint. Ranks 1..N-1 are helper
processes (``python -m training.engine.distributed.helper``; not multiprocessing, because a Celery
prefork child is a daemon process and may not have children). They receive everything through
the rendezvous store on 127.0.0.1 (a ``TCPStore`` that rank 0 opens on a free port): the
replica's blob (``replica``: configs, parameters, AdamW state, schedule position
and the recipe of the rank's sampler).

Before every inner step rank 0 broadcasts a control word: go on or stop, and whether it
adopted a global version since the last step, in which case its parameters follow (a
broadcast from rank 0). AdamW state needs no broadcast: the all-reduced gradients are the same
on every rank, so the moments stay identical. At the end each helper leaves its sampler's
position in the store; rank 0 keeps them (``Learner.rank_samplers``) and they go into the
learner checkpoint, so the next chunk, in any process, continues every rank's stream.

The group lives between chunks. A chunk is a *session* of the group: ``group_start(key=...)``
finds the group this process kept for the same key (run, learner, generation, ranks, devices)
and starts its next session, or starts helpers afresh (closing a group kept for another key).
A session whose learner is the one the previous session left, at the same step, tells the
helpers ``continue`` (they keep their replicas and streams; DDP's constructor broadcasts rank
0's parameters, so a version adopted between chunks reaches them); any other learner (restored
from a checkpoint, rejoined) is sent whole (``load``). So a chunk pays no Python start, torch
import, shard open or gloo rendezvous after the first: its length is a scheduling choice.
The group ends on failure (``abort`` kills the helpers), when another key needs the process,
when the run ends (``group_release``), when it has been idle for ``idle_s`` (both sides time
out: rank 0's timer, the helpers' wait) and when rank 0 exits (helpers watch their parent).

A helper that dies or raises fails the chunk: rank 0 sees the exit (or the collective error)
and raises ``RankError``; the chunk protocol retries the whole chunk from the checkpoint
before it, so the retry redoes the same work. A kept group found dead as a session starts is
not a failure: its helpers are started afresh for that session.
"""

from __future__ import annotations

from training.engine.distributed.group import RANK_IDLE_S, RANK_TIMEOUT_S, RankError, RankGroup, rank_device
from training.engine.distributed.leader import LeaderGroup, group_release, group_start, kept_group
from training.engine.distributed.replica import SamplerSpec, helper_learner, replica_blob, sampler_from_spec

# The helper's entry point (training.engine.distributed.helper) is not imported here: it runs
# as ``python -m``, which must find it unimported.
__all__ = [
    "RANK_IDLE_S",
    "RANK_TIMEOUT_S",
    "LeaderGroup",
    "RankError",
    "RankGroup",
    "SamplerSpec",
    "group_release",
    "group_start",
    "helper_learner",
    "kept_group",
    "rank_device",
    "replica_blob",
    "sampler_from_spec",
]
