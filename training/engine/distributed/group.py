"""What every rank of a learner's group shares: the timeouts, the session words, the per-step
control word and parameter broadcast (``RankGroup``), DDP wrapping and joining the default
process group. Rank 0's side is training.engine.distributed.leader, the helpers'
training.engine.distributed.helper."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from training.engine.learner import Learner

# How long a collective, or the helpers' start, may take before the group gives up. Generous:
# a helper imports torch and opens its shard on a machine that also runs other workers.
RANK_TIMEOUT_S = 120.0
# How long a kept group waits for its next session before it ends. A learner's next chunk is
# enqueued as its last one finishes, so the gap is a queue's latency; a learner re-placed on
# another cluster leaves its old group to this timer.
RANK_IDLE_S = 120.0
ADDR = "127.0.0.1"
# The word that starts session n (the key ``go/n``): see training.engine.distributed.helper.
LOAD, CONTINUE, END = b"load", b"continue", b"end"


def put(store: Any, key: str, data: bytes) -> None:
    # Store.set takes bytes as well as str (its type stubs say only str).
    store.set(key, data)


class RankError(RuntimeError):
    """A rank of a learner's process group failed (the message says which and why)."""


class GroupStopped(Exception):  # noqa: N818 (a signal, not an error)
    """Rank 0 said stop: a helper's training loop ends."""


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(rank: int, base: torch.device) -> torch.device:
    """Rank r's device: the CUDA device named (`cuda:3`: the one its chunk owns), else CUDA
    device r (mod the count) on a GPU machine, else the CPU."""
    if base.type == "cuda":
        if base.index is not None:
            return base
        return torch.device("cuda", rank % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


class RankGroup:
    """This process's place in a learner's process group (see the module docstring)."""

    def __init__(
        self, *, rank: int, world: int, device: torch.device, watch: Callable[[], None] | None = None
    ) -> None:
        self.rank, self.world, self.device = rank, world, device
        self.watch = watch  # rank 0: raises RankError when a helper has exited

    def sync(self, learner: Learner) -> None:
        """Before an inner step: rank 0 says go (and sends its parameters if it adopted a
        version since the last step); a helper hears it, or raises GroupStopped."""
        if self.watch is not None:
            self.watch()
        ctrl = torch.zeros(2, dtype=torch.int64, device=self.device)
        if self.rank == 0:
            ctrl[0], ctrl[1] = 1, int(learner.params_changed)
        dist.broadcast(ctrl, src=0)
        if int(ctrl[0]) == 0:
            raise GroupStopped
        if int(ctrl[1]):
            self._broadcast_params(learner)
        learner.params_changed = False

    def stop(self) -> None:
        """Rank 0: the helpers' loops end (the control word says stop)."""
        dist.broadcast(torch.zeros(2, dtype=torch.int64, device=self.device), src=0)

    def mean(self, value: torch.Tensor) -> float:
        """The mean over the ranks of a scalar (each rank's train loss on its own batch)."""
        t = value.detach().float().reshape(1).to(self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t) / self.world

    @torch.no_grad()
    def _broadcast_params(self, learner: Learner) -> None:
        params = list(learner.params.values())
        flat = torch.nn.utils.parameters_to_vector(params)
        dist.broadcast(flat, src=0)
        if self.rank != 0:
            torch.nn.utils.vector_to_parameters(flat, params)


def wrap(learner: Learner, group: RankGroup) -> None:
    """The learner's forward goes through DDP (whose constructor broadcasts rank 0's parameters)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [group.device.index] if group.device.type == "cuda" else None
    learner.net = DistributedDataParallel(learner.model, device_ids=ids)
    learner.group = group


def unwrap(learner: Learner) -> None:
    learner.net = learner.model
    learner.group = None


def init_group(group: RankGroup, store: Any, timeout: datetime.timedelta) -> None:
    """Join the default process group (every rank of the group calls it once)."""
    if group.device.type == "cuda":
        torch.cuda.set_device(group.device)
    dist.init_process_group(
        backend_for(group.device), store=store, rank=group.rank, world_size=group.world, timeout=timeout
    )
