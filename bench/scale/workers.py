"""The drill's processes: each learner, the syncer and moto's S3 server run in their own OS process
(multiprocessing, spawn), so each one's peak RSS is its own. The parent (bench.scale.drill)
drives them in lockstep over a pipe: a command in, one JSON-able reply out.

A learner does what a learner without a checkpoint does (training.orchestrator): it joins by
reading the newest full version of every fragment, then per outer step brings its held copy to
the newest version through the down-deltas (falling back to the full version), and pushes one
delta per fragment through the transport. The compute is the drill's only fake: the delta is
seeded noise of each tensor's shape (no forward, no backward, no optimizer), encoded tensor by
tensor with the engine's Compressor.

The syncer is training.engine.syncer.Syncer over training.engine.transport.ObjectStoreTransport,
as training.orchestrator.syncer_tick_execute drives it (pull, poll, then the retention sweep
after a publish), without the database rows: the retention keeps the newest K versions and the
learners' bases within max_staleness (training.services.retention.run_retention, less the
registry's pins and the recorded-version guard, which need the database).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from bench.scale.meter import CountingStore, peak_rss_bytes
from bench.scale.model import Shapes, initial_params
from storage.objectstore import open_store
from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, CompressionKind, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta, GlobalVersion
from training.engine.syncer import Syncer
from training.engine.transport import ObjectStoreTransport, Retention

NOISE_STD = 1e-3  # the synthetic Δ: about what an outer gradient of a trained model looks like


@dataclass(frozen=True)
class Spec:
    """Everything a drill process needs (pickled into it at spawn)."""

    store_url: str
    endpoint_url: str | None
    prefix: str
    shapes: Shapes
    fragments: list[list[str]]
    learners: int
    kind: CompressionKind
    keep_versions: int
    max_staleness: int
    seed: int
    learner_threads: int


class TimedTransport(ObjectStoreTransport):
    """The engine's transport, timing its writes of global versions (the syncer's merge and
    publish run inside one Syncer.poll; this tells the store's share from the arithmetic's)."""

    def __init__(self, store: CountingStore, prefix: str) -> None:
        super().__init__(store, prefix=prefix)
        self.publish_seconds = 0.0

    def publish(self, version: GlobalVersion) -> bool:
        t0 = time.monotonic()
        try:
            return super().publish(version)
        finally:
            self.publish_seconds += time.monotonic() - t0


def _transport(spec: Spec) -> tuple[CountingStore, TimedTransport]:
    store = CountingStore(open_store(spec.store_url, endpoint_url=spec.endpoint_url))
    return store, TimedTransport(store, prefix=spec.prefix)


def _counters(store: CountingStore, transport: ObjectStoreTransport) -> dict[str, Any]:
    return {
        "bytes_up": transport.bytes_up,
        "bytes_down": transport.bytes_down,
        "peak_rss_bytes": peak_rss_bytes(),
        "store": store.counters(),
    }


# ---- learner ------------------------------------------------------------------------------
class DrillLearner:
    """A learner's transport side: its held copy of the global model and its pushes."""

    def __init__(self, spec: Spec, index: int) -> None:
        self.spec, self.index = spec, index
        self.store, self.transport = _transport(spec)
        self.compressor = Compressor(CompressionConfig(kind=spec.kind))
        self.gen = torch.Generator().manual_seed(spec.seed + 1 + index)
        self.seq = 0
        self.held: dict[str, torch.Tensor] = {}
        self.held_version = [0] * len(spec.fragments)
        for f in range(len(spec.fragments)):
            self._take_full(f)

    def _take_full(self, f: int) -> None:
        stored = self.transport.versions(f)
        if not stored:
            raise RuntimeError(f"fragment {f} has no published version to join from")
        found = self.transport.get_held(f, max(stored))  # the mirror only, as a learner reads it
        self.held.update({n: found.held[n].float() for n in self.spec.fragments[f]})
        self.held_version[f] = found.version

    @torch.no_grad()
    def catch_up(self) -> None:
        """Held copy to the newest version of every fragment: down-deltas, else the full version."""
        for f in range(len(self.spec.fragments)):
            newest = max(self.transport.versions(f) or [0])
            try:
                for v in range(self.held_version[f] + 1, newest + 1):
                    for name, t in self.transport.get_down(f, v).decoded().items():
                        self.held[name].add_(t)
                    self.held_version[f] = v
            except LookupError:
                self._take_full(f)

    @torch.no_grad()
    def push(self) -> int:
        """One delta per fragment against the held version; returns their payload bytes."""
        payload = 0
        for f, names in enumerate(self.spec.fragments):
            tensors = {}
            for name in names:
                noise = torch.randn(self.spec.shapes.tensors[name], generator=self.gen).mul_(NOISE_STD)
                tensors.update(self.compressor.compress({name: noise}))
            delta = FragmentDelta(
                learner=self.index,
                fragment=f,
                base_version=self.held_version[f],
                seq=self.seq,
                steps=1,
                tokens=1,
                tensors=tensors,
                sent_at=time.time(),
            )
            self.seq += 1
            self.transport.put_delta(delta)
            payload += delta.nbytes
        return payload


def learner_main(conn: Connection, spec: Spec, index: int) -> None:
    torch.set_num_threads(spec.learner_threads)
    if conn.recv() != "join":  # started beside the syncer; joins once version 0 is published
        return
    learner = DrillLearner(spec, index)
    conn.send(
        {"join_bytes_down": learner.transport.bytes_down, **_counters(learner.store, learner.transport)}
    )
    while conn.recv() == "step":
        up, down = learner.transport.bytes_up, learner.transport.bytes_down
        t0 = time.monotonic()
        learner.catch_up()
        t1 = time.monotonic()
        payload = learner.push()
        conn.send(
            {
                "fetch_s": t1 - t0,
                "push_s": time.monotonic() - t1,
                "step_bytes_up": learner.transport.bytes_up - up,
                "step_bytes_down": learner.transport.bytes_down - down,
                "payload_bytes_up": payload,
                "held_version": list(learner.held_version),
                **_counters(learner.store, learner.transport),
            }
        )
    conn.send(_counters(learner.store, learner.transport))


# ---- syncer -------------------------------------------------------------------------------
def _retention(spec: Spec, syncer: Syncer) -> Retention:
    bases = {f: sorted(set(syncer.learner_bases(f).values())) for f in range(len(spec.fragments))}
    return Retention(keep_newest=spec.keep_versions, learner_bases=bases, reach=spec.max_staleness)


def syncer_main(conn: Connection, spec: Spec, resume: bool) -> None:
    store, transport = _transport(spec)
    cfg = SyncerConfig(learners=spec.learners, max_staleness=spec.max_staleness)
    t0 = time.monotonic()
    if resume:
        syncer = Syncer.resume(
            cfg=cfg,
            outer=OuterConfig(),
            fragments=spec.fragments,
            transport=transport,
            down=spec.kind,
            offload=True,
        )
    else:
        syncer = Syncer(
            cfg=cfg,
            outer=OuterConfig(),
            fragments=spec.fragments,
            init=initial_params(spec.shapes, spec.seed),
            transport=transport,
            down=spec.kind,
            offload=True,  # as the control worker runs it (training.orchestrator)
        )
    conn.send(
        {
            "start_s": time.monotonic() - t0,
            "versions": list(syncer.version),
            "objects_read": store.objects_read,
            "pid": os.getpid(),
            **_counters(store, transport),
        }
    )
    while conn.recv() == "step":
        now = time.time()
        up, down, publishing = transport.bytes_up, transport.bytes_down, transport.publish_seconds
        t0 = time.monotonic()
        new = syncer.pull(now)
        t1 = time.monotonic()
        published = syncer.poll(now)
        t2 = time.monotonic()
        freed = kept = 0
        if published:
            spent = {f: syncer.spent_deltas(f) for f in range(len(spec.fragments))}
            swept = transport.sweep(_retention(spec, syncer), spent)
            freed, kept = swept.bytes_freed, swept.bytes_kept
        conn.send(
            {
                "pull_s": t1 - t0,
                "merge_publish_s": t2 - t1,
                "publish_s": transport.publish_seconds - publishing,
                "sweep_s": time.monotonic() - t2,
                "new_deltas": new,
                "published": [[v.fragment, v.version] for v in published],
                "step_bytes_up": transport.bytes_up - up,
                "step_bytes_down": transport.bytes_down - down,
                "swept_bytes_freed": freed,
                "bytes_kept": kept,
                **_counters(store, transport),
            }
        )
        del published
    conn.send(_counters(store, transport))


# ---- the S3 endpoint ----------------------------------------------------------------------
class StoreServer:
    """moto's S3 server on loopback, run as its own program (`python -m moto.server`: a dev
    requirement, which run.py checks is installed; nothing here imports it)."""

    def __init__(self, bucket: str, *, timeout_s: float = 30.0) -> None:
        import boto3  # lazily, like storage.objectstore

        with socket.socket() as probe:  # a free port for it (released just before it binds)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        self.process = subprocess.Popen(  # noqa: S603 (our interpreter, fixed arguments)
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start on {self.url}") from None
                time.sleep(0.1)
        boto3.client("s3", endpoint_url=self.url).create_bucket(Bucket=bucket)

    def peak_rss_bytes(self) -> int | None:
        """Its peak resident set (VmHWM), read from /proc while it runs; None elsewhere."""
        try:
            with open(f"/proc/{self.process.pid}/status") as fh:
                lines = fh.readlines()
        except OSError:
            return None
        found = [int(line.split()[1]) * 1024 for line in lines if line.startswith("VmHWM:")]
        return found[0] if found else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
