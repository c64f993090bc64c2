"""What every rank of a learner's group shares: the timeouts, the session words, the per-step
control word and parameter broadcast (``RankGroup``), wrapping in DDP or FSDP2 and joining the
default process group. Rank 0's side is training.engine.distributed.leader, the helpers'
training.engine.distributed.helper."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from training.engine.distributed.sharding import HOW, fragment_adopt, fragment_delta, shard, unshard
from training.engine.learner import Adopt, Learner

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


# The control word rank 0 broadcasts before each inner step (and before each collective of a
# sharded group's outer step): (command, argument, kind, alpha).
STOP, STEP, DELTA, ADOPT = 0, 1, 2, 3
HOW_NAMES: dict[int, Adopt] = {code: name for name, code in HOW.items()}  # type: ignore[misc]


class RankGroup:
    """This process's place in a learner's process group (see the module docstring). With
    ``sharded`` the learner trains through FSDP2 (training.engine.distributed.sharding), else DDP."""

    def __init__(
        self,
        *,
        rank: int,
        world: int,
        device: torch.device,
        watch: Callable[[], None] | None = None,
        sharded: bool = False,
    ) -> None:
        self.rank, self.world, self.device, self.sharded = rank, world, device, sharded
        self.watch = watch  # rank 0: raises RankError when a helper has exited

    def _word(self, *values: float) -> list[float]:
        """Broadcast rank 0's control word (``values``); every rank gets it back."""
        ctrl = torch.zeros(4, dtype=torch.float64, device=self.device)
        if self.rank == 0:
            ctrl[: len(values)] = torch.tensor(values, dtype=torch.float64)
        dist.broadcast(ctrl, src=0)
        return [float(v) for v in ctrl.tolist()]

    def sync(self, learner: Learner) -> None:
        """Before an inner step: rank 0 says go (and sends its parameters if it adopted a
        version since the last step, in a DDP group). A helper hears it, or raises
        GroupStopped; in a sharded group it first joins the outer-step collectives rank 0
        announces (a fragment's Δ, an adoption) until the word is go."""
        if self.watch is not None:
            self.watch()
        while True:
            word = self._word(STEP, float(learner.params_changed)) if self.rank == 0 else self._word()
            command, arg = int(word[0]), word[1]
            if command == STOP:
                raise GroupStopped
            if command == DELTA:
                fragment_delta(learner, int(arg), keep=False)
            elif command == ADOPT:
                fragment_adopt(learner, int(arg), None, HOW_NAMES[int(word[2])], word[3])
            else:
                break
        if arg and not self.sharded:
            self._broadcast_params(learner)
        learner.params_changed = False

    def stop(self) -> None:
        """Rank 0: the helpers' loops end (the control word says stop)."""
        self._word(STOP)

    def delta(self, learner: Learner, fragment: int) -> dict[str, torch.Tensor]:
        """Rank 0 of a sharded group: a fragment's whole Δ, from every rank's shards."""
        if self.watch is not None:
            self.watch()
        self._word(DELTA, fragment)
        return fragment_delta(learner, fragment, keep=True)

    def adopt(
        self, learner: Learner, fragment: int, params: Mapping[str, torch.Tensor], how: Adopt, alpha: float
    ) -> None:
        """Rank 0 of a sharded group: every rank adopts the global fragment into its shards."""
        if self.watch is not None:
            self.watch()
        self._word(ADOPT, fragment, HOW[how], alpha)
        fragment_adopt(learner, fragment, params, how, alpha)

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
    """The learner trains as a rank of ``group``: through DDP (whose constructor broadcasts
    rank 0's parameters) or, in a sharded group, through FSDP2 (a collective: every rank
    calls it)."""
    if group.sharded:
        shard(learner, rank=group.rank, world=group.world, device=group.device)
    else:
        ids = [group.device.index] if group.device.type == "cuda" else None
        learner.net = DistributedDataParallel(learner.model, device_ids=ids)
    learner.group = group


def unwrap(learner: Learner, *, gather: bool = True) -> None:
    """The learner is whole again. A sharded one gathers its shards (a collective, every rank
    in the same order), unless ``gather`` is False: after a failure, when the group cannot
    gather, it goes back to its host state from before the session (and is not used again)."""
    if learner.sharded is not None:
        unshard(learner, gather=gather)
    learner.net = learner.model
    learner.group = None


def init_group(group: RankGroup, store: Any, timeout: datetime.timedelta) -> None:
    """Join the default process group (every rank of the group calls it once)."""
    if group.device.type == "cuda":
        torch.cuda.set_device(group.device)
    dist.init_process_group(
        backend_for(group.device), store=store, rank=group.rank, world_size=group.world, timeout=timeout
    )
