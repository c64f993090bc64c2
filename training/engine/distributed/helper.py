"""Ranks 1..N-1 of a learner's process group: the helper process (``python -m
training.engine.distributed.helper``) that rank 0 (training.engine.distributed.leader) starts.

A helper lives across chunks. It connects to rank 0's rendezvous store, then serves sessions
numbered 0, 1, 2, ...: for session n it waits for the word under ``go/n``.

* ``load``: build the replica from ``s{n}/spec/{rank}`` (model and inner config, parameters,
  AdamW state, schedule position, the sampler's recipe and position), as on its first session;
* ``continue``: keep the replica it trained in session n - 1 (rank 0's state is the one that
  session left: the same learner, the same step);
* ``end``: leave the group and exit.

It then says ``s{n}/ready/{rank}``, joins the process group on its first session, trains
through DDP (or FSDP2, with ``--sharding fsdp``: it joins the outer step's collectives too)
until rank 0's control word says stop, and leaves its sampler's position under
``s{n}/result/{rank}``. Between sessions it waits at most ``--idle`` seconds, and no longer
than its parent (rank 0) lives: a worker that was killed or moved its learner elsewhere leaves
no helper behind.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from storage.tensorblob import pack
from training.engine.distributed.group import (
    ADDR,
    CONTINUE,
    END,
    LOAD,
    RANK_IDLE_S,
    RANK_TIMEOUT_S,
    GroupStopped,
    RankGroup,
    init_group,
    put,
    rank_device,
    unwrap,
    wrap,
)
from training.engine.distributed.replica import helper_learner
from training.engine.learner import Learner


def _next_word(store: Any, session: int, *, idle_s: float, parent: int) -> bytes:
    """The word of session ``session`` (LOAD, CONTINUE or END); END when none came within
    ``idle_s`` seconds, when the parent is gone or when its store cannot be reached.

    It polls with ``check`` (a timed-out ``wait`` makes c10d log a warning each time), often at
    first, since a learner's next chunk usually follows at once, then every 50 ms."""
    key = f"go/{session}"
    started = time.monotonic()
    while True:
        try:
            if store.check([key]):
                return bytes(store.get(key))
        except dist.DistError:  # rank 0's store went away with its process
            return END
        waited = time.monotonic() - started
        if os.getppid() != parent or waited > idle_s:
            return END
        time.sleep(0.002 if waited < 1.0 else 0.05)


def helper_main(
    *, rank: int, world: int, port: int, device: str, timeout_s: float, idle_s: float, sharding: str = "ddp"
) -> int:
    """Rank ``rank`` of a learner's group: serve sessions until rank 0 says end (or goes away,
    or none comes within ``idle_s``). Returns the exit code."""
    torch.set_num_threads(1)  # as the worker processes: the cores are shared
    parent = os.getppid()
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(ADDR, port, world, False, timeout=timeout)
    dev = rank_device(rank, torch.device(device))
    sharded = sharding == "fsdp"
    group = RankGroup(rank=rank, world=world, device=dev, sharded=sharded)
    host = torch.device("cpu") if sharded else dev  # a sharded replica is whole on the host only
    learner: Learner | None = None
    joined = False
    session = 0
    try:
        while True:
            word = _next_word(store, session, idle_s=idle_s, parent=parent)
            if word == END:
                return 0
            if word == LOAD:
                spec = f"s{session}/spec/{rank}"
                learner = helper_learner(store.get(spec), host)
                store.delete_key(spec)  # a replica is model-sized: the store keeps no old one
            elif word != CONTINUE or learner is None:
                raise RuntimeError(f"session {session}: unexpected word {word!r}")
            put(store, f"s{session}/ready/{rank}", b"1")
            if not joined:
                init_group(group, store, timeout)
                joined = True
            wrap(learner, group)
            with contextlib.suppress(GroupStopped):  # rank 0's control word ends the session
                while True:
                    learner.train_step()
            unwrap(learner)  # a sharded replica gathers its shards with the other ranks
            tensors = {}
            state = learner.sampler_state()
            if state is not None:
                tensors["sampler"] = state
            put(
                store, f"s{session}/result/{rank}", pack({"rank": rank, "steps": learner.step_count}, tensors)
            )
            session += 1
    finally:
        if joined and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one helper rank of a learner's process group")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=RANK_TIMEOUT_S)
    parser.add_argument("--idle", type=float, default=RANK_IDLE_S)
    parser.add_argument("--sharding", choices=("ddp", "fsdp"), default="ddp")
    args = parser.parse_args(argv)
    try:
        return helper_main(
            rank=args.rank,
            world=args.world,
            port=args.port,
            device=args.device,
            timeout_s=args.timeout,
            idle_s=args.idle,
            sharding=args.sharding,
        )
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything this rank had to say is in the store or on stderr: skip the interpreter's
    # teardown of torch (a second or more on a busy machine, which rank 0 would wait for).
    os._exit(code)
