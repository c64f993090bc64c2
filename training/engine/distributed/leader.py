"""Rank 0's side of a learner's process group: the helpers it starts, the group it keeps between
chunks, and the sessions it runs on it (see the package's docstring)."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

from storage.tensorblob import unpack
from training.engine.distributed.group import (
    ADDR,
    CONTINUE,
    END,
    LOAD,
    RANK_IDLE_S,
    RANK_TIMEOUT_S,
    RankError,
    RankGroup,
    init_group,
    put,
    unwrap,
    wrap,
)
from training.engine.distributed.replica import SamplerSpec, replica_blob
from training.engine.learner import Learner

logger = logging.getLogger(__name__)

# One process group per process at a time (torch.distributed's default group is global): a
# worker runs one chunk at a time, and tests that run two chunks in threads wait here. Held for
# a session; the group kept between sessions is _KEPT.
_GROUP_LOCK = threading.Lock()


# A kept group's identity: the caller's key (the orchestrator's: run, learner, generation),
# the world size, the ranks' devices, the learner's device type and the sharding (ddp, fsdp).
GroupKey = tuple[Hashable, int, tuple[str, ...], str, str]


class LeaderGroup:
    """Rank 0's side of a learner's process group: the helper processes, the rendezvous store
    and the default process group. ``group_start`` begins a session (a chunk) on it; ``finish``
    ends the session and keeps the group for the next one (or ends it, for a group without a
    key); ``abort`` kills it."""

    def __init__(
        self,
        *,
        key: GroupKey | None,
        device: torch.device,
        world: int,
        timeout_s: float,
        idle_s: float,
        sharded: bool = False,
    ) -> None:
        self.key, self.idle_s = key, idle_s
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.store: Any = None
        self.group = RankGroup(rank=0, world=world, device=device, watch=self.check, sharded=sharded)
        self.session = 0  # the session under way, or the next one
        self.learner: Learner | None = None  # the learner of the session under way
        self.joined = False  # rank 0 is in the default process group
        self.holds_lock = False  # a session is under way (it holds _GROUP_LOCK)
        # Where the last session left the helpers' replicas: that learner object, at that step.
        self._left: tuple[weakref.ref[Learner], int] | None = None
        self._ended_at = 0.0
        self._timer: threading.Timer | None = None
        # What the last start did: kept the group (and whether the replicas went on as they
        # were) or started helpers, and how long it took. The chunk records it.
        self.kept = False
        self.continued = False
        self.start_seconds = 0.0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def check(self) -> None:
        """Raise RankError if a helper has exited (its output's last lines say why): within a
        session a helper never exits."""
        for r, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise RankError(f"rank {r} exited with {code}: {self._tail(r)}")

    def _tail(self, rank: int) -> str:
        log = self.logs[rank - 1]
        with contextlib.suppress(OSError, ValueError):
            log.seek(0)
            lines = log.read().decode("utf-8", "replace").strip().splitlines()
            return " | ".join(lines[-3:])[-1000:] or "(no output)"
        return "(no output)"

    def launch(self, env: dict[str, str], devices: list[str]) -> None:
        """Open the rendezvous store and start ranks 1..N-1 (rank r on ``devices[r - 1]``);
        they wait for session 0."""
        # Port 0: the store binds a free loopback port itself (no race with another process).
        self.store = dist.TCPStore(
            ADDR, 0, self.group.world, True, timeout=self.timeout, wait_for_workers=False
        )
        env = {**env, "MASTER_ADDR": ADDR, "MASTER_PORT": str(self.store.port)}
        for r in range(1, self.group.world):
            log = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the group)
            self.logs.append(log)
            cmd = [sys.executable, "-m", "training.engine.distributed.helper", "--rank", str(r)]
            cmd += ["--world", str(self.group.world), "--port", str(self.store.port)]
            cmd += ["--device", devices[r - 1]]
            cmd += ["--timeout", str(self.timeout.total_seconds()), "--idle", str(self.idle_s)]
            cmd += ["--sharding", "fsdp" if self.group.sharded else "ddp"]
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))  # noqa: S603

    def may_continue(self, key: GroupKey | None) -> bool:
        """This kept group may serve a session for ``key``: the same key, not idle too long."""
        return key is not None and key == self.key and time.monotonic() - self._ended_at < self.idle_s / 2

    def begin(self, learner: Learner, samplers: Sequence[SamplerSpec]) -> None:
        """Start session ``self.session`` for ``learner``: the helpers continue their replicas
        if this learner is where the last session left them, else each is sent its replica."""
        n = self.session
        left = self._left
        self.continued = left is not None and left[0]() is learner and left[1] == learner.step_count
        self.continued = self.continued and learner.rank_skip == 0
        if not self.continued:
            for r, spec in enumerate(samplers, start=1):
                blob = replica_blob(learner, rank=r, sampler=spec, shapes_only=self.group.sharded)
                put(self.store, f"s{n}/spec/{r}", blob)
        put(self.store, f"go/{n}", CONTINUE if self.continued else LOAD)
        # init_process_group (and DDP's first broadcast) blocks until every rank arrived; a
        # helper that failed to start would make rank 0 wait the whole timeout. Wait for their
        # "ready" keys first, watching them.
        deadline = time.monotonic() + self.timeout.total_seconds()
        for r in range(1, self.group.world):
            while not self.store.check([f"s{n}/ready/{r}"]):
                self.check()
                if time.monotonic() > deadline:
                    raise RankError(f"rank {r} did not start within {self.timeout.total_seconds():g}s")
                time.sleep(0.01)
        if not self.joined:
            init_group(self.group, self.store, self.timeout)
            self.joined = True
        wrap(learner, self.group)
        learner.params_changed = False
        self.learner = learner

    def finish(self) -> None:
        """End the session: stop the helpers' loops, keep their samplers' positions in the
        learner, and keep the group for the key's next session (or end it)."""
        learner, n = self.learner, self.session
        assert learner is not None  # noqa: S101 (a session is under way)
        try:
            self.check()
            self.group.stop()
            unwrap(learner)  # a sharded learner gathers its shards with the helpers here
            keys = [f"s{n}/result/{r}" for r in range(1, self.group.world)]
            self.store.wait(keys, self.timeout)
            for r in range(1, self.group.world):
                _, tensors = unpack(self.store.get(f"s{n}/result/{r}"))
                for done in (f"s{n}/result/{r}", f"s{n}/ready/{r}", f"go/{n}"):
                    self.store.delete_key(done)
                if "sampler" in tensors:
                    learner.rank_samplers[r] = tensors["sampler"]
        except RankError:
            self.abort()
            raise
        except Exception as exc:  # a collective or the store failed: a helper is gone
            self.abort()
            raise RankError(f"process group failed: {exc}") from exc
        self.learner = None
        self._left = (weakref.ref(learner), learner.step_count)
        self.session += 1
        self._ended_at = time.monotonic()
        try:
            if self.key is None:
                self.end()
            else:
                _keep(self)
        finally:
            self._unlock()

    def abort(self) -> None:
        """Kill the helpers and leave the group (after any failure)."""
        try:
            self.kill()
        finally:
            self._unlock()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        self._close()

    def end(self) -> None:
        """Tell the helpers to leave (the word ``end``), wait for them a little, then close."""
        with contextlib.suppress(Exception):  # the store or a helper may be gone already
            put(self.store, f"go/{self.session}", END)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.kill()

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.learner is not None:
            unwrap(self.learner, gather=False)  # its group failed: nothing to gather from
            self.learner = None
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self.joined and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.joined = False
        for log in self.logs:
            log.close()
        self.logs = []

    def _unlock(self) -> None:
        if self.holds_lock:
            self.holds_lock = False
            _GROUP_LOCK.release()


# The group this process keeps between sessions (guarded by _GROUP_LOCK).
_KEPT: LeaderGroup | None = None


def _keep(leader: LeaderGroup) -> None:
    """Keep ``leader`` for its key's next session; it ends by itself after idle_s / 2."""
    global _KEPT
    _KEPT = leader
    timer = threading.Timer(leader.idle_s / 2, _release_kept, kwargs={"only": leader})
    timer.daemon = True
    leader._timer = timer
    timer.start()


def _release_kept(
    *, only: LeaderGroup | None = None, match: Callable[[GroupKey], bool] | None = None
) -> bool:
    global _KEPT
    if not _GROUP_LOCK.acquire(blocking=False):
        return False  # a session is under way: its own start decides what to keep
    try:
        leader = _KEPT
        if leader is None or (only is not None and leader is not only):
            return False
        if match is not None and (leader.key is None or not match(leader.key)):
            return False
        _KEPT = None
        leader._timer = None  # this may be its timer's thread: nothing to cancel
        leader.end()
        return True
    finally:
        _GROUP_LOCK.release()


def group_release(match: Callable[[Any], bool] | None = None) -> bool:
    """End the group this process keeps between sessions (only if ``match`` accepts the key
    that ``group_start`` was given). False if there was none, or a session is under way."""
    if match is None:
        return _release_kept()

    def caller_key_matches(key: GroupKey) -> bool:
        return match(key[0])

    return _release_kept(match=caller_key_matches)


def kept_group() -> LeaderGroup | None:
    """The group this process keeps between sessions, if any."""
    return _KEPT


atexit.register(group_release)  # a worker that exits tells its helpers to leave


def group_start(
    learner: Learner,
    *,
    samplers: Sequence[SamplerSpec],
    timeout_s: float = RANK_TIMEOUT_S,
    devices: list[torch.device] | None = None,
    key: Hashable | None = None,
    idle_s: float = RANK_IDLE_S,
    sharding: str = "ddp",
) -> LeaderGroup:
    """Begin a session of ranks 1..N-1 (``samplers[r - 1]`` is rank r's recipe) with this
    process as rank 0. Rank r runs on ``devices[r]`` (the learner, rank 0, is on ``devices[0]``
    already); without them, on its rank's device of the learner's device type (rank_device).

    With a ``key``, the group this process kept from a session of the same key (and world and
    devices) is used again, and ``finish`` keeps it; without one, ``finish`` ends it. The
    learner trains through DDP (``sharding="ddp"``) or FSDP2 (``"fsdp"``: the learner stays
    whole on its host device, the CPU, and rank r trains on ``devices[r]``, else on CUDA when
    there is one) until ``finish`` (or ``abort``) is called on the result.
    """
    global _KEPT
    world = len(samplers) + 1
    if not _GROUP_LOCK.acquire(timeout=timeout_s):
        raise RankError("another process group is still running in this process")
    began = time.monotonic()
    full_key = None
    if key is not None:
        full_key = (key, world, tuple(map(str, devices or ())), learner.device.type, sharding)
    leader, _KEPT = _KEPT, None
    kept = leader is not None and leader.may_continue(full_key)
    try:
        if leader is not None and not kept:
            leader.end()
        elif leader is not None:
            if leader._timer is not None:
                leader._timer.cancel()
                leader._timer = None
            try:
                leader.begin(learner, samplers)
            except Exception as exc:  # it died while kept (killed, timed out): start it afresh
                logger.info("rank group %s was gone (%s); starting its ranks again", key, exc)
                leader.kill()
                kept = False
        if not kept:
            leader = _spawn(
                learner,
                world=world,
                key=full_key,
                devices=devices,
                timeout_s=timeout_s,
                idle_s=idle_s,
                sharded=sharding == "fsdp",
            )
            leader.begin(learner, samplers)
    except Exception as exc:
        if leader is not None:
            leader.kill()
        _GROUP_LOCK.release()
        if isinstance(exc, RankError):
            raise
        raise RankError(f"process group did not start: {exc}") from exc
    assert leader is not None  # noqa: S101 (kept or spawned)
    leader.holds_lock = True
    leader.kept, leader.start_seconds = kept, time.monotonic() - began
    return leader


def _spawn(
    learner: Learner,
    *,
    world: int,
    key: GroupKey | None,
    devices: list[torch.device] | None,
    timeout_s: float,
    idle_s: float,
    sharded: bool,
) -> LeaderGroup:
    device = learner.device
    if sharded:  # the learner is whole on the host; its shards train on the devices
        device = devices[0] if devices else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    leader = LeaderGroup(
        key=key, device=device, world=world, timeout_s=timeout_s, idle_s=idle_s, sharded=sharded
    )
    # The helpers import this package from the same checkout, whatever the worker's cwd.
    root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    rank_devices = [str(devices[r]) if devices else device.type for r in range(1, world)]
    try:
        leader.launch(env, rank_devices)
    except Exception:
        leader.kill()
        raise
    return leader
