"""How deltas reach the syncer and global versions reach learners.

``Transport`` is the interface; :class:`InMemoryTransport` serves tests and the benchmark,
:class:`ObjectStoreTransport` keeps everything in an object store (``file://`` or ``s3://``,
see :mod:`storage.objectstore`) for the orchestration layer. Keys:

    <prefix>/deltas/f<fragment>/<delta id>.syd
    <prefix>/versions/f<fragment>/v<version>.syd     the full version (params, momentum, mirror, down)
    <prefix>/down/f<fragment>/v<version>.syd         its down-delta alone: what learners fetch

A global version is written with ``put_if_absent``: the first publisher of version v wins
and a second attempt (a resumed or duplicated syncer) is told so instead of overwriting.
The down-delta object is a copy of the winner's ``down`` tensors, written right after it; a
publisher killed in between leaves it missing, and the first reader writes it from the
version blob (the same bytes, so it does not matter who does).
"""

from __future__ import annotations

import copy
from typing import Protocol

from storage.objectstore import ObjectNotFoundError, ObjectStore
from training.engine.messages import (
    DownDelta,
    FragmentDelta,
    GlobalVersion,
    delta_from_bytes,
    delta_to_bytes,
    down_from_bytes,
    down_to_bytes,
    version_from_bytes,
    version_to_bytes,
)


class Transport(Protocol):
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

    def get_down(self, fragment: int, version: int) -> DownDelta:
        """Version v as a difference from v − 1 of the learners' copy; LookupError if it has none."""
        ...


def learner_prefix(learner: int) -> str:
    """Delta ids of one learner start with this (``FragmentDelta.id``)."""
    return f"l{learner:04d}-"


def latest_version(transport: Transport, fragment: int) -> GlobalVersion | None:
    found = transport.versions(fragment)
    return transport.get_version(fragment, max(found)) if found else None


class InMemoryTransport:
    """Dicts in one process; objects are copied in and out so nobody aliases anybody."""

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

    def get_down(self, fragment: int, version: int) -> DownDelta:
        v = self._versions[fragment][version]
        if not v.down:
            raise LookupError(f"fragment {fragment} version {version} has no down-delta")
        self.bytes_down += v.down_delta().nbytes
        return copy.deepcopy(v.down_delta())


class ObjectStoreTransport:
    """Deltas and versions as blobs under ``prefix`` in an object store."""

    def __init__(self, store: ObjectStore, prefix: str = "") -> None:
        self.store = store
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def _delta_key(self, fragment: int, delta_id: str) -> str:
        return f"{self.prefix}deltas/f{fragment:03d}/{delta_id}.syd"

    def _version_key(self, fragment: int, version: int) -> str:
        return f"{self.prefix}versions/f{fragment:03d}/v{version:08d}.syd"

    def _down_key(self, fragment: int, version: int) -> str:
        return f"{self.prefix}down/f{fragment:03d}/v{version:08d}.syd"

    def put_delta(self, delta: FragmentDelta) -> None:
        self.store.put(self._delta_key(delta.fragment, delta.id), delta_to_bytes(delta))

    def delta_ids(self, fragment: int, learner: int | None = None) -> list[str]:
        head = f"{self.prefix}deltas/f{fragment:03d}/"
        narrow = head + (learner_prefix(learner) if learner is not None else "")
        return [k[len(head) : -len(".syd")] for k in self.store.list(narrow) if k.endswith(".syd")]

    def get_delta(self, fragment: int, delta_id: str) -> FragmentDelta:
        return delta_from_bytes(self.store.get(self._delta_key(fragment, delta_id)))

    def publish(self, version: GlobalVersion) -> bool:
        key = self._version_key(version.fragment, version.version)
        if not self.store.put_if_absent(key, version_to_bytes(version)):
            return False
        if version.down:
            self.store.put(
                self._down_key(version.fragment, version.version), down_to_bytes(version.down_delta())
            )
        return True

    def versions(self, fragment: int) -> list[int]:
        head = f"{self.prefix}versions/f{fragment:03d}/v"
        return sorted(int(k[len(head) : -len(".syd")]) for k in self.store.list(head))

    def get_version(self, fragment: int, version: int) -> GlobalVersion:
        return version_from_bytes(self.store.get(self._version_key(fragment, version)))

    def get_down(self, fragment: int, version: int) -> DownDelta:
        key = self._down_key(fragment, version)
        try:
            return down_from_bytes(self.store.get(key))
        except ObjectNotFoundError:
            pass
        # Its publisher died between the two writes: write it from the version blob.
        full = self.get_version(fragment, version)
        if not full.down:
            raise LookupError(f"fragment {fragment} version {version} has no down-delta") from None
        down = full.down_delta()
        self.store.put(key, down_to_bytes(down))
        return down
