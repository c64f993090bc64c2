"""A learner as a process group: N ranks train one replica each, data-parallel (DDP) inside it.

DiLoCo runs across learners as before; inside a learner, its inner steps are split over N
ranks with ``torch.distributed`` (gloo on CPU, NCCL on CUDA) and
``torch.nn.parallel.DistributedDataParallel``, which averages the ranks' gradients in the
backward pass (PyTorch docs, "DistributedDataParallel"). Each rank draws ``batch / N`` windows
from its own shard, so a step of N ranks is a step of the learner's whole batch.

Rank 0 is the process that runs the chunk (the Celery worker): it alone fetches global
versions, pushes deltas, adopts versions and writes the checkpoint. Ranks 1..N-1 are helper
processes started for the chunk (``python -m training.engine.distributed``; not
multiprocessing, because a Celery prefork child is a daemon process and may not have
children). They receive everything through the rendezvous store on 127.0.0.1 (a
``TCPStore`` that rank 0 opens on a free port): a tensor blob (storage.tensorblob, no pickle)
with the model config, the inner config, the replica's parameters, AdamW state and schedule
position, and the recipe of the rank's sampler (its shard and its saved position).

Before every inner step rank 0 broadcasts a control word: go on or stop, and whether it
adopted a global version since the last step, in which case its parameters follow (a
broadcast from rank 0). AdamW state needs no broadcast: the all-reduced gradients are the same
on every rank, so the moments stay identical. At the end each helper leaves its sampler's
position in the store; rank 0 keeps them (``Learner.rank_samplers``) and they go into the
learner checkpoint, so the next chunk, in any process, continues every rank's stream.

A helper that dies or raises fails the chunk: rank 0 sees the exit (or the collective error)
and raises ``RankError``; the chunk protocol retries the whole chunk from the checkpoint
before it, so the retry redoes the same work.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

from storage.objectstore import ObjectStore
from storage.tensorblob import pack, unpack
from training.engine.config import InnerConfig
from training.engine.data import BatchSampler, Sampler
from training.engine.learner import Learner
from training.engine.model import AnyModelConfig, model_config_from_dict, model_config_to_dict

# How long a collective, or the helpers' start, may take before the group gives up. Generous:
# a helper imports torch and opens its shard on a machine that also runs other workers.
RANK_TIMEOUT_S = 120.0
ADDR = "127.0.0.1"

# One process group per process at a time (torch.distributed's default group is global): a
# worker runs one chunk at a time, and tests that run two chunks in threads wait here.
_GROUP_LOCK = threading.Lock()


def _put(store: Any, key: str, data: bytes) -> None:
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


def _wrap(learner: Learner, group: RankGroup) -> None:
    """The learner's forward goes through DDP (whose constructor broadcasts rank 0's parameters)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [group.device.index] if group.device.type == "cuda" else None
    learner.net = DistributedDataParallel(learner.model, device_ids=ids)
    learner.group = group


def _unwrap(learner: Learner) -> None:
    learner.net = learner.model
    learner.group = None


# --- what a helper is told ---------------------------------------------------------------------


def replica_blob(
    learner: Learner, *, rank: int, sampler: tuple[dict[str, Any], dict[str, torch.Tensor]]
) -> bytes:
    """Everything helper ``rank`` needs: model and inner config, parameters, AdamW state, the
    schedule position, and its sampler's recipe (and saved position, if the learner has one)."""
    meta, tensors = learner.state_dict()
    keep = {k: t for k, t in tensors.items() if k.startswith(("param:", "opt:"))}
    sampler_meta, sampler_tensors = sampler
    keep.update({f"sampler_spec:{k}": t for k, t in sampler_tensors.items()})
    saved = learner.rank_samplers.get(rank)
    if saved is not None:
        keep["sampler"] = saved
    inner = asdict(learner.inner)
    header = {
        "model": model_config_to_dict(learner.model_cfg),
        "inner": inner,
        "fragments": learner.fragments,
        "learner": {k: meta[k] for k in ("learner", "step_count", "opt_keys")},
        "ranks": learner.ranks,
        "sampler": sampler_meta,
        "skip": learner.rank_skip,  # windows a dead chunk pushed (Learner.skip_windows)
    }
    return pack(header, keep)


# --- rank 0 ------------------------------------------------------------------------------------


class LeaderGroup:
    """Rank 0's side: starts the helpers, joins the group, stops them, collects their state."""

    def __init__(
        self, learner: Learner, *, procs: list[subprocess.Popen[bytes]], logs: list[IO[bytes]]
    ) -> None:
        self.learner, self.procs, self.logs = learner, procs, logs
        self.group: RankGroup | None = None
        self.store: Any = None
        self.locked = True  # holds _GROUP_LOCK until closed

    def check(self) -> None:
        """Raise RankError if a helper has exited (its stderr's last lines say why)."""
        for r, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None and code != 0:
                raise RankError(f"rank {r} exited with {code}: {self._tail(r)}")

    def _tail(self, rank: int) -> str:
        log = self.logs[rank - 1]
        with contextlib.suppress(OSError, ValueError):
            log.seek(0)
            lines = log.read().decode("utf-8", "replace").strip().splitlines()
            return " | ".join(lines[-3:])[-1000:] or "(no output)"
        return "(no output)"

    def finish(self) -> None:
        """Stop the helpers, keep their samplers' positions in the learner, leave the group."""
        assert self.group is not None  # noqa: S101 (started)
        try:
            self.check()
            self.group.stop()
            keys = [f"result/{r}" for r in range(1, len(self.procs) + 1)]
            self.store.wait(keys, datetime.timedelta(seconds=RANK_TIMEOUT_S))
            for r in range(1, len(self.procs) + 1):
                _, tensors = unpack(self.store.get(f"result/{r}"))
                if "sampler" in tensors:
                    self.learner.rank_samplers[r] = tensors["sampler"]
            for r, proc in enumerate(self.procs, start=1):
                if proc.wait(timeout=RANK_TIMEOUT_S) != 0:
                    raise RankError(f"rank {r} exited with {proc.returncode}: {self._tail(r)}")
        except RankError:
            self.abort()
            raise
        except Exception as exc:  # a collective or the store failed: a helper is gone
            self.abort()
            raise RankError(f"process group failed: {exc}") from exc
        self._close()

    def abort(self) -> None:
        """Kill the helpers this chunk started and leave the group (after any failure)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        _unwrap(self.learner)
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        for log in self.logs:
            log.close()
        self.logs = []
        if self.locked:
            self.locked = False
            _GROUP_LOCK.release()


def group_start(
    learner: Learner,
    *,
    samplers: list[tuple[dict[str, Any], dict[str, torch.Tensor]]],
    timeout_s: float = RANK_TIMEOUT_S,
    devices: list[torch.device] | None = None,
) -> LeaderGroup:
    """Start ranks 1..N-1 (``samplers[r - 1]`` is rank r's recipe) and join them as rank 0.
    Rank r runs on ``devices[r]`` (the learner, rank 0, is on ``devices[0]`` already); without
    them, on its rank's device of the learner's device type (rank_device).

    The learner trains through DDP until ``finish`` (or ``abort``) is called on the result.
    """
    world = len(samplers) + 1
    if not _GROUP_LOCK.acquire(timeout=timeout_s):
        raise RankError("another process group is still running in this process")
    leader: LeaderGroup | None = None
    try:
        timeout = datetime.timedelta(seconds=timeout_s)
        # Port 0: the store binds a free loopback port itself (no race with another process).
        store = dist.TCPStore(ADDR, 0, world, True, timeout=timeout, wait_for_workers=False)
        for r, spec in enumerate(samplers, start=1):
            _put(store, f"spec/{r}", replica_blob(learner, rank=r, sampler=spec))
        # The helpers import this package from the same checkout, whatever the worker's cwd.
        root = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "MASTER_ADDR": ADDR, "MASTER_PORT": str(store.port), "PYTHONPATH": path}
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[IO[bytes]] = []
        for r in range(1, world):
            log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the leader)
            logs.append(log)
            cmd = [
                sys.executable,
                "-m",
                "training.engine.distributed",
                "--rank",
                str(r),
                "--world",
                str(world),
            ]
            rank_dev = str(devices[r]) if devices else learner.device.type
            cmd += ["--port", str(store.port), "--device", rank_dev, "--timeout", str(timeout_s)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))  # noqa: S603
        leader = LeaderGroup(learner, procs=procs, logs=logs)
        leader.store = store
        device = learner.device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        group = RankGroup(rank=0, world=world, device=device, watch=leader.check)
        leader.group = group
        _init_group(group, store, timeout, leader)
        _wrap(learner, group)
        learner.params_changed = False
        return leader
    except Exception as exc:
        if leader is not None:
            leader.abort()
        else:
            _GROUP_LOCK.release()
        if isinstance(exc, RankError):
            raise
        raise RankError(f"process group did not start: {exc}") from exc


def _init_group(
    group: RankGroup, store: Any, timeout: datetime.timedelta, leader: LeaderGroup | None
) -> None:
    """Join the default process group; rank 0 keeps an eye on its helpers while it waits."""
    if group.device.type == "cuda":
        torch.cuda.set_device(group.device)
    if leader is None:
        dist.init_process_group(
            backend_for(group.device), store=store, rank=group.rank, world_size=group.world, timeout=timeout
        )
        return
    # init_process_group blocks until every rank arrived; a helper that failed to start would
    # make rank 0 wait the whole timeout. Wait for their "ready" keys first, watching them.
    deadline = time.monotonic() + timeout.total_seconds()
    for r in range(1, group.world):
        while True:
            leader.check()
            if store.check([f"ready/{r}"]):
                break
            if time.monotonic() > deadline:
                raise RankError(f"rank {r} did not start within {timeout.total_seconds():g}s")
            time.sleep(0.05)
    dist.init_process_group(
        backend_for(group.device), store=store, rank=0, world_size=group.world, timeout=timeout
    )


# --- ranks 1..N-1 ------------------------------------------------------------------------------


def sampler_from_spec(
    meta: dict[str, Any], tensors: dict[str, torch.Tensor], *, store: ObjectStore | None = None
) -> Sampler:
    """A rank's sampler from its recipe (training.run_engines.sampler_spec writes it): the byte
    corpus shard and seed, or a text dataset's shard (read from ``store``, or the store at the
    recipe's URL)."""
    if meta["kind"] == "bytes":
        return BatchSampler(
            tensors["data"], block_size=meta["block_size"], batch_size=meta["batch_size"], seed=meta["seed"]
        )
    from storage.objectstore import open_store
    from training.engine.stream import DatasetManifest, TextDataset, TokenStream
    from training.engine.tokenizer import ByteTokenizer, JsonTokenizer, Tokenizer

    if store is None:
        store = open_store(meta["store_url"], endpoint_url=meta.get("endpoint_url"))
    tokenizer: Tokenizer = ByteTokenizer()
    if "tokenizer_json" in tensors:
        tokenizer = JsonTokenizer(bytes(tensors["tokenizer_json"].tolist()), eos_id=meta.get("eos_id"))
    dataset = TextDataset(
        keys=tuple(meta["keys"]),
        format=meta["format"],
        text_field=meta["text_field"],
        eval_every_nth=meta["eval_every_nth"],
    )
    stream = TokenStream(
        store,
        dataset,
        tokenizer,
        block_size=meta["block_size"],
        batch_size=meta["batch_size"],
        shard=meta["shard"],
        shards=meta["shards"],
        manifest=DatasetManifest.from_dict(meta["manifest"]) if meta.get("manifest") else None,
    )
    if meta.get("skip"):
        stream.skip(int(meta["skip"]))
    return stream


def _helper_learner(blob: bytes, device: torch.device) -> Learner:
    header, tensors = unpack(blob)
    inner = dict(header["inner"])
    inner["betas"] = tuple(inner["betas"])
    spec = {k[len("sampler_spec:") :]: t for k, t in tensors.items() if k.startswith("sampler_spec:")}
    sampler = sampler_from_spec(header["sampler"], spec)
    model_cfg: AnyModelConfig = model_config_from_dict(header["model"])
    init = {k[len("param:") :]: t for k, t in tensors.items() if k.startswith("param:")}
    learner = Learner(
        learner_id=int(header["learner"]["learner"]),
        model_cfg=model_cfg,
        inner=InnerConfig(**inner),
        fragments=header["fragments"],
        sampler=sampler,
        init=init,
        device=device,
        ranks=int(header["ranks"]),
    )
    learner.load_replica(header["learner"], tensors)
    learner.skip_windows(int(header.get("skip", 0)))
    return learner


def helper_main(*, rank: int, world: int, port: int, device: str, timeout_s: float) -> int:
    """Rank ``rank`` of a learner's group: train until rank 0 says stop, leave the sampler's
    position in the store. Returns the exit code."""
    torch.set_num_threads(1)  # as the worker processes: the cores are shared
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(ADDR, port, world, False, timeout=timeout)
    dev = rank_device(rank, torch.device(device))
    learner = _helper_learner(store.get(f"spec/{rank}"), dev)
    group = RankGroup(rank=rank, world=world, device=dev)
    _put(store, f"ready/{rank}", b"1")
    _init_group(group, store, timeout, None)
    _wrap(learner, group)
    try:
        while True:
            learner.train_step()
    except GroupStopped:
        pass
    _unwrap(learner)
    tensors = {}
    state = learner.sampler_state()
    if state is not None:
        tensors["sampler"] = state
    _put(store, f"result/{rank}", pack({"rank": rank, "steps": learner.step_count}, tensors))
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one helper rank of a learner's process group")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=RANK_TIMEOUT_S)
    args = parser.parse_args(argv)
    try:
        return helper_main(
            rank=args.rank, world=args.world, port=args.port, device=args.device, timeout_s=args.timeout
        )
    except Exception:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything this rank had to say is in the store or on stderr: skip the interpreter's
    # teardown of torch (a second or more on a busy machine, which the chunk would wait for).
    os._exit(code)
