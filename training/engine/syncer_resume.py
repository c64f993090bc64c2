"""Rebuilding a syncer from the store (Syncer.resume): with every fragment's state in memory,
or offloaded (its newest version's header only; training.engine.syncer's docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from training.engine.config import CompressionKind, OuterConfig, SyncerConfig
from training.engine.transport import Transport, latest_version

if TYPE_CHECKING:
    from training.engine.syncer import Syncer


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
    versions: list[int] = []
    consumed: set[str] = set()
    lags: dict[int, float] = {}
    bases: list[dict[int, tuple[int, int]]] = [{} for _ in fragments]
    for f in range(len(fragments)):
        latest = latest_version(transport, f)
        if latest is None:
            if init is None:
                raise ValueError(f"fragment {f} has no published version and no init")
            params.update({n: init[n].detach().float().clone() for n in fragments[f]})
            mirror.update({n: init[n].detach().float().clone() for n in fragments[f]})
            versions.append(0)
            continue
        params.update(latest.params)
        mirror.update(latest.held)
        momentum.update(latest.momentum)
        versions.append(latest.version)
        lags.update({int(k): float(v) for k, v in latest.meta.get("lags", {}).items()})
        bases[f] = {int(j): (int(sb[0]), int(sb[1])) for j, sb in latest.meta.get("bases", {}).items()}
        if "consumed" in latest.meta:
            consumed.update(latest.meta["consumed"])
            continue
        for v in transport.versions(f):
            consumed.update(transport.get_version(f, v).merged)
    syncer = cls(
        cfg=cfg,
        outer=outer,
        fragments=fragments,
        init=params,
        transport=transport,
        versions=versions,
        down=down,
        mirror=mirror,
        owned=True,  # read from the store for it: one copy in memory, not two
    )
    syncer.outer.load_state_dict(momentum, owned=True)
    syncer.consumed = consumed
    syncer.lag = lags
    syncer.bases = bases
    return syncer


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
    versions: list[int] = []
    consumed: set[str] = set()
    lags: dict[int, float] = {}
    bases: list[dict[int, tuple[int, int]]] = [{} for _ in fragments]
    unpublished = []
    for f in range(len(fragments)):
        found = transport.versions(f)
        if not found:
            if init is None:
                raise ValueError(f"fragment {f} has no published version and no init")
            versions.append(0)
            unpublished.append(f)
            continue
        head = transport.version_header(f, max(found))
        versions.append(head.version)
        lags.update({int(k): float(v) for k, v in head.meta.get("lags", {}).items()})
        bases[f] = {int(j): (int(sb[0]), int(sb[1])) for j, sb in head.meta.get("bases", {}).items()}
        if "consumed" in head.meta:
            consumed.update(head.meta["consumed"])
            continue
        for v in found:
            consumed.update(transport.version_header(f, v).merged)
    syncer = cls(
        cfg=cfg,
        outer=outer,
        fragments=fragments,
        init={},
        transport=transport,
        versions=versions,
        publish_initial=False,
        down=down,
        offload=True,
    )
    for f in unpublished:
        assert init is not None  # noqa: S101 (checked above)
        transport.publish(syncer.initial_version(f, init, None))
    syncer.consumed = consumed
    syncer.lag = lags
    syncer.bases = bases
    return syncer
