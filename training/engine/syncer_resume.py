"""Rebuilding a syncer from the store (Syncer.resume): with every fragment's state in memory,
or offloaded (its newest version's header only; training.engine.syncer's docstring)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from training.engine.config import CompressionKind, OuterConfig, SyncerConfig
from training.engine.messages import GlobalVersion
from training.engine.transport import Transport, latest_version

if TYPE_CHECKING:
    from training.engine.syncer import Syncer


@dataclass
class _Books:
    """What a resume rebuilds besides tensors: versions, consumed ids, learners' lags and bases."""

    versions: list[int] = field(default_factory=list)
    consumed: set[str] = field(default_factory=set)
    lags: dict[int, float] = field(default_factory=dict)
    bases: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)

    def take(self, fragment: int, newest: GlobalVersion, older: Iterable[list[str]]) -> None:
        """A fragment's newest version; `older` (lazy) yields every stored version's merged ids,
        consumed only for a version written before versions listed their consumed deltas."""
        self.versions.append(newest.version)
        self.lags.update({int(k): float(v) for k, v in newest.meta.get("lags", {}).items()})
        found = newest.meta.get("bases", {}).items()
        self.bases[fragment] = {int(j): (int(sb[0]), int(sb[1])) for j, sb in found}
        if "consumed" in newest.meta:
            self.consumed.update(newest.meta["consumed"])
            return
        for merged in older:
            self.consumed.update(merged)

    def restore(self, syncer: Syncer, fragments: int) -> Syncer:
        syncer.consumed = self.consumed
        syncer.lag = self.lags
        syncer.bases = [self.bases.get(f, {}) for f in range(fragments)]
        return syncer


def resume_resident(
    cls: type[Syncer],
    *,
    cfg: SyncerConfig,
    outer: OuterConfig,
    fragments: list[list[str]],
    transport: Transport,
    init: Mapping[str, torch.Tensor] | None = None,
    down: CompressionKind = "fp32",
) -> Syncer:
    """Syncer.resume keeping every fragment's state in memory (the syncer's default).

    It reads that one version per fragment: the version lists the consumed deltas still in
    the store (``meta["consumed"]``), so the first ``pull`` reads only the pending ones.
    Versions written before that list existed are all read for their ``merged`` ids.
    """
    params: dict[str, torch.Tensor] = {}
    mirror: dict[str, torch.Tensor] = {}
    momentum: dict[str, torch.Tensor] = {}
    books = _Books()
    for f in range(len(fragments)):
        latest = latest_version(transport, f)
        if latest is None:
            if init is None:
                raise ValueError(f"fragment {f} has no published version and no init")
            params.update({n: init[n].detach().float().clone() for n in fragments[f]})
            mirror.update({n: init[n].detach().float().clone() for n in fragments[f]})
            books.versions.append(0)
            continue
        params.update(latest.params)
        mirror.update(latest.held)
        momentum.update(latest.momentum)
        books.take(f, latest, (transport.get_version(f, v).merged for v in transport.versions(f)))
    syncer = cls(
        cfg=cfg,
        outer=outer,
        fragments=fragments,
        init=params,
        transport=transport,
        versions=books.versions,
        down=down,
        mirror=mirror,
        owned=True,  # read from the store for it: one copy in memory, not two
    )
    syncer.outer.load_state_dict(momentum, owned=True)
    return books.restore(syncer, len(fragments))


def resume_offloaded(
    cls: type[Syncer],
    *,
    cfg: SyncerConfig,
    outer: OuterConfig,
    fragments: list[list[str]],
    transport: Transport,
    init: Mapping[str, torch.Tensor] | None = None,
    down: CompressionKind = "fp32",
) -> Syncer:
    """`resume` keeping no state: the newest version of each fragment is read for its header
    (meta and merged ids) only; a fragment never published gets its version 0 from `init`."""
    books = _Books()
    unpublished = []
    for f in range(len(fragments)):
        found = transport.versions(f)
        if not found:
            if init is None:
                raise ValueError(f"fragment {f} has no published version and no init")
            books.versions.append(0)
            unpublished.append(f)
            continue
        head = transport.version_header(f, max(found))
        books.take(f, head, (transport.version_header(f, v).merged for v in found))
    syncer = cls(
        cfg=cfg,
        outer=outer,
        fragments=fragments,
        init={},
        transport=transport,
        versions=books.versions,
        publish_initial=False,
        down=down,
        offload=True,
    )
    for f in unpublished:
        assert init is not None  # noqa: S101 (checked above)
        transport.publish(syncer.initial_version(f, init, None))
    return books.restore(syncer, len(fragments))
