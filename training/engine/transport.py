"""How deltas reach the syncer and global versions reach learners.

``Transport`` is the interface; :class:`InMemoryTransport` serves tests and the benchmark,
:class:`ObjectStoreTransport` keeps everything in an object store (``file://`` or ``s3://``,
see :mod:`storage.objectstore`) for the orchestration layer. Keys:

    <prefix>/deltas/f<fragment>/<delta id>.syd
    <prefix>/versions/f<fragment>/v<version>.syd     the full version (params, momentum, mirror, down)
    <prefix>/down/f<fragment>/v<version>.syd         its down-delta alone: what learners fetch

Every object is a tensor blob streamed in and out (storage.tensorblob.blob_write / blob_read),
so a model-sized version never exists as one byte string. A global version is written once
(``put_stream_if_absent``): the first publisher of version v wins and a second attempt (a
resumed or duplicated syncer) is told so instead of overwriting.

Nothing here deletes on its own: the retention sweep (:meth:`ObjectStoreTransport.sweep`, run by
training.services.retention after the syncer publishes) deletes the versions a
:class:`Retention` does not keep, with their down-deltas, and the consumed deltas the syncer
names (:meth:`Syncer.spent_deltas`), and reports what it freed.
The down-delta object is a copy of the winner's ``down`` tensors, written right after it; a
publisher killed in between leaves it missing, and the first reader writes it from the
version blob (the same bytes, so it does not matter who does).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from storage.objectstore import FileStore, ObjectNotFoundError, ObjectStore, S3Store
from storage.tensorblob import Meter, blob_meta, blob_read, blob_write
from training.engine.messages import (
    DownDelta,
    FragmentDelta,
    GlobalVersion,
    delta_from_parts,
    delta_parts,
    down_from_parts,
    down_parts,
    version_from_parts,
    version_parts,
)


class Transport(Protocol):
    @property
    def bytes_up(self) -> int:
        """Bytes this transport has sent so far (each implementation says what counts)."""
        ...

    @property
    def bytes_down(self) -> int:
        """Bytes this transport has received so far."""
        ...

    def put_delta(self, delta: FragmentDelta) -> None: ...

    def delta_ids(self, fragment: int, learner: int | None = None) -> list[str]:
        """Ids of the deltas stored for a fragment (only one learner's when given)."""
        ...

    def get_delta(self, fragment: int, delta_id: str) -> FragmentDelta: ...

    def publish(self, version: GlobalVersion) -> bool:
        """Write a version once; False if that (fragment, version) already exists."""
        ...

    def versions(self, fragment: int) -> list[int]: ...

    def get_version(self, fragment: int, version: int) -> GlobalVersion: ...

    def version_header(self, fragment: int, version: int) -> GlobalVersion:
        """Version v's fragment, version, merged ids and meta, without its tensors."""
        ...

    def get_held(self, fragment: int, version: int) -> GlobalVersion:
        """Version v with only what learners hold (``held``): no params, momentum or down."""
        ...

    def get_down(self, fragment: int, version: int) -> DownDelta:
        """Version v as a difference from v − 1 of the learners' copy; LookupError if it has none."""
        ...


def learner_prefix(learner: int) -> str:
    """Delta ids of one learner start with this (``FragmentDelta.id``)."""
    return f"l{learner:04d}-"


def latest_version(transport: Transport, fragment: int) -> GlobalVersion | None:
    found = transport.versions(fragment)
    return transport.get_version(fragment, max(found)) if found else None


def object_sizes(store: ObjectStore, prefix: str = "") -> dict[str, int]:
    """Every key under ``prefix`` with its size in bytes, from one listing.

    storage.objectstore lists keys without sizes; this reads them where each store keeps them
    (a file's stat, S3's ListObjectsV2 ``Size``). A store that offers ``sizes(prefix)`` is asked
    for them instead; any other store reports 0 bytes per key.
    """
    sizes = getattr(store, "sizes", None)
    if callable(sizes):
        return dict(sizes(prefix))
    if isinstance(store, FileStore):
        found = {}
        for key in store.list(prefix):
            try:
                found[key] = (Path(store.root) / key).stat().st_size
            except FileNotFoundError:  # deleted since the listing
                continue
        return found
    if isinstance(store, S3Store):
        found = {}
        paginator = store.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=store.bucket, Prefix=store.prefix + prefix):
            for obj in page.get("Contents", []):
                found[obj["Key"][len(store.prefix) :]] = int(obj["Size"])
        return found
    return dict.fromkeys(store.list(prefix), 0)


@dataclass(frozen=True)
class Retention:
    """Which of a fragment's stored versions the sweep keeps.

    The newest ``keep_newest`` (K ≥ 1, so the newest is always there); every version in
    ``pinned`` (registered model versions and those due to be); every version newer than
    ``recorded`` (published but not yet in the database); and for each base version in
    ``learner_bases`` (a live learner holds it or a newer one) no more than ``reach`` versions
    behind the newest, that version and every later one, whose down-deltas bring the learner's
    copy to the newest. A learner further behind fetches the newest full version instead.
    """

    keep_newest: int
    pinned: dict[int, set[int]] = field(default_factory=dict)
    learner_bases: dict[int, list[int]] = field(default_factory=dict)
    reach: int = 0
    recorded: dict[int, int] | None = None

    def keeps(self, fragment: int, stored: list[int]) -> set[int]:
        if not stored:
            return set()
        ordered = sorted(stored)
        newest = ordered[-1]
        keep = set(ordered[-max(1, self.keep_newest) :])
        keep |= self.pinned.get(fragment, set()) & set(ordered)
        if self.recorded is not None:
            upto = self.recorded.get(fragment, -1)
            keep |= {v for v in ordered if v > upto}
        for base in self.learner_bases.get(fragment, []):
            if newest - base <= self.reach:
                keep |= {v for v in ordered if v >= base}
        return keep


@dataclass
class Swept:
    """What one sweep deleted, and what the prefix still holds."""

    versions: list[tuple[int, int]] = field(default_factory=list)  # (fragment, version) deleted
    deltas: int = 0
    objects: int = 0
    bytes_freed: int = 0
    bytes_kept: int = 0  # every object left under the prefix (checkpoints and exports too)


class InMemoryTransport:
    """Dicts in one process; objects are copied in and out so nobody aliases anybody.

    Nothing crosses a store here: `bytes_up` / `bytes_down` are the payloads' sizes (values and
    quantisation scales), what a store would carry less each blob's header."""

    def __init__(self) -> None:
        self._deltas: dict[int, dict[str, FragmentDelta]] = {}
        self._versions: dict[int, dict[int, GlobalVersion]] = {}
        self.bytes_up = 0
        self.bytes_down = 0

    def put_delta(self, delta: FragmentDelta) -> None:
        self._deltas.setdefault(delta.fragment, {})[delta.id] = delta
        self.bytes_up += delta.nbytes

    def delta_ids(self, fragment: int, learner: int | None = None) -> list[str]:
        head = learner_prefix(learner) if learner is not None else ""
        return sorted(i for i in self._deltas.get(fragment, {}) if i.startswith(head))

    def get_delta(self, fragment: int, delta_id: str) -> FragmentDelta:
        return self._deltas[fragment][delta_id]

    def publish(self, version: GlobalVersion) -> bool:
        slot = self._versions.setdefault(version.fragment, {})
        if version.version in slot:
            return False
        slot[version.version] = copy.deepcopy(version)
        return True

    def versions(self, fragment: int) -> list[int]:
        return sorted(self._versions.get(fragment, {}))

    def get_version(self, fragment: int, version: int) -> GlobalVersion:
        v = self._versions[fragment][version]
        self.bytes_down += v.nbytes
        return copy.deepcopy(v)

    def version_header(self, fragment: int, version: int) -> GlobalVersion:
        v = self._versions[fragment][version]
        return GlobalVersion(v.fragment, v.version, {}, {}, list(v.merged), copy.deepcopy(v.meta))

    def get_held(self, fragment: int, version: int) -> GlobalVersion:
        v = self._versions[fragment][version]
        self.bytes_down += v.nbytes
        return GlobalVersion(
            v.fragment, v.version, {}, {}, list(v.merged), copy.deepcopy(v.meta), copy.deepcopy(dict(v.held))
        )

    def get_down(self, fragment: int, version: int) -> DownDelta:
        v = self._versions[fragment][version]
        if not v.down:
            raise LookupError(f"fragment {fragment} version {version} has no down-delta")
        self.bytes_down += v.down_delta().nbytes
        return copy.deepcopy(v.down_delta())


def _held_tensors(names: list[str]) -> set[str]:
    """Of a version blob's tensors, those that make the learners' copy (version_parts' prefixes)."""
    mirror = {n for n in names if n.startswith("h:")}
    return mirror or {n for n in names if n.startswith("p:")}


_STORED = re.compile(r"(?P<kind>versions|down)/f(?P<fragment>\d+)/v(?P<version>\d+)\.syd$")


class ObjectStoreTransport:
    """Deltas and versions as blobs under ``prefix`` in an object store.

    `bytes_up` / `bytes_down` are measured: every byte of every blob this transport wrote to or
    read from the store (headers included), not the payloads' computed sizes."""

    def __init__(self, store: ObjectStore, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.meter = Meter()

    @property
    def bytes_up(self) -> int:
        return self.meter.written

    @property
    def bytes_down(self) -> int:
        return self.meter.read

    def _delta_key(self, fragment: int, delta_id: str) -> str:
        return f"{self.prefix}deltas/f{fragment:03d}/{delta_id}.syd"

    def _version_key(self, fragment: int, version: int) -> str:
        return f"{self.prefix}versions/f{fragment:03d}/v{version:08d}.syd"

    def _down_key(self, fragment: int, version: int) -> str:
        return f"{self.prefix}down/f{fragment:03d}/v{version:08d}.syd"

    def put_delta(self, delta: FragmentDelta) -> None:
        blob_write(
            self.store, self._delta_key(delta.fragment, delta.id), *delta_parts(delta), meter=self.meter
        )

    def delta_ids(self, fragment: int, learner: int | None = None) -> list[str]:
        head = f"{self.prefix}deltas/f{fragment:03d}/"
        narrow = head + (learner_prefix(learner) if learner is not None else "")
        return [k[len(head) : -len(".syd")] for k in self.store.list(narrow) if k.endswith(".syd")]

    def get_delta(self, fragment: int, delta_id: str) -> FragmentDelta:
        return delta_from_parts(*blob_read(self.store, self._delta_key(fragment, delta_id), meter=self.meter))

    def publish(self, version: GlobalVersion) -> bool:
        key = self._version_key(version.fragment, version.version)
        if not blob_write(self.store, key, *version_parts(version), if_absent=True, meter=self.meter):
            return False
        if version.down:
            blob_write(
                self.store,
                self._down_key(version.fragment, version.version),
                *down_parts(version.down_delta()),
                meter=self.meter,
            )
        return True

    def versions(self, fragment: int) -> list[int]:
        head = f"{self.prefix}versions/f{fragment:03d}/v"
        return sorted(int(k[len(head) : -len(".syd")]) for k in self.store.list(head))

    def get_version(self, fragment: int, version: int) -> GlobalVersion:
        return version_from_parts(
            *blob_read(self.store, self._version_key(fragment, version), meter=self.meter)
        )

    def get_held(self, fragment: int, version: int) -> GlobalVersion:
        """Version v with only the learners' copy (its mirror; the params of a blob written
        before mirrors existed): the params, momentum and down-delta are read past, not held."""
        meta, tensors = blob_read(
            self.store, self._version_key(fragment, version), meter=self.meter, keep=_held_tensors
        )
        return GlobalVersion(
            meta["fragment"],
            meta["version"],
            params={k[2:]: t for k, t in tensors.items() if k.startswith("p:")},
            momentum={},
            merged=list(meta["merged"]),
            meta=dict(meta["meta"]),
            mirror={k[2:]: t for k, t in tensors.items() if k.startswith("h:")},
        )

    def version_header(self, fragment: int, version: int) -> GlobalVersion:
        head = blob_meta(self.store, self._version_key(fragment, version), meter=self.meter)
        return GlobalVersion(
            head["fragment"], head["version"], {}, {}, list(head["merged"]), dict(head["meta"])
        )

    def delete_version(self, fragment: int, version: int) -> None:
        """The version blob first, then its down-delta: a reader that misses the down-delta then
        finds no blob to rewrite it from (an orphan down-delta goes at the next sweep)."""
        self.store.delete(self._version_key(fragment, version))
        self.store.delete(self._down_key(fragment, version))

    def sweep(self, retention: Retention, spent: dict[int, list[str]]) -> Swept:
        """Delete every version (and down-delta) ``retention`` does not keep and the ``spent``
        deltas (fragment -> ids); sizes come from one listing of the prefix."""
        sizes = object_sizes(self.store, self.prefix)
        stored: dict[int, dict[str, list[int]]] = {}
        for key in sizes:
            m = _STORED.match(key[len(self.prefix) :])
            if m:
                kinds = stored.setdefault(int(m["fragment"]), {"versions": [], "down": []})
                kinds[m["kind"]].append(int(m["version"]))
        doomed: list[str] = []
        swept = Swept()
        for f, kinds in sorted(stored.items()):
            keep = retention.keeps(f, kinds["versions"])
            for v in sorted(set(kinds["versions"]) - keep):
                doomed.append(self._version_key(f, v))
                swept.versions.append((f, v))
            doomed += [self._down_key(f, v) for v in sorted(set(kinds["down"]) - keep)]
        for f, ids in sorted(spent.items()):
            for delta_id in ids:
                key = self._delta_key(f, delta_id)
                if key in sizes:
                    doomed.append(key)
                    swept.deltas += 1
        for key in doomed:  # in order: a version blob before its down-delta
            self.store.delete(key)
        swept.objects = len(doomed)
        swept.bytes_freed = sum(sizes[k] for k in doomed)
        swept.bytes_kept = sum(sizes.values()) - swept.bytes_freed
        return swept

    def get_down(self, fragment: int, version: int) -> DownDelta:
        key = self._down_key(fragment, version)
        try:
            return down_from_parts(*blob_read(self.store, key, meter=self.meter))
        except ObjectNotFoundError:
            pass
        # Its publisher died between the two writes: write it from the version blob.
        full = self.get_version(fragment, version)
        if not full.down:
            raise LookupError(f"fragment {fragment} version {version} has no down-delta") from None
        down = full.down_delta()
        blob_write(self.store, key, *down_parts(down), meter=self.meter)
        return down
