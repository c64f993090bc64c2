"""The decoupled syncer (arXiv 2604.21428): merges fragment deltas into global versions.

Per fragment f at global version v the syncer keeps the deltas that arrived. A delta is
*fresh* when it was computed against v, *stale* (staleness s = v − base) otherwise.

* Quorum: once K distinct learners sent a fresh delta, a grace window opens; the fragment is
  merged when it closes, or at once when all M learners are in (K = M and grace 0 is the
  barrier of plain DiLoCo, arXiv 2311.08105).
* Weights: each delta weighs by the tokens behind it (or 1 each), times ``discount ** s``
  for a stale delta under the ``discount`` policy; ``drop`` ignores stale deltas; anything
  staler than ``max_staleness`` is always ignored. Weights are normalised to sum to one,
  so Δ is a weighted mean of outer gradients.
* Radial-directional averaging (optional, arXiv 2604.21428): per tensor, average the norms
  and the unit directions separately, Δ = mean‖Δ_i‖ · normalise(mean Δ_i/‖Δ_i‖), so that
  disagreeing learners do not shrink the step the way a plain mean does.
* The outer optimizer (Nesterov SGD, :mod:`training.engine.outer`) applies Δ and version
  v + 1 is published with its momentum and the ids of the deltas it consumed. Publishing is
  write-once, so a syncer that was killed and resumed (:meth:`Syncer.resume`) never applies
  a delta twice: it restarts from the newest published version and skips consumed ids.

Time is whatever the caller says it is (virtual seconds in the simulator, ``time.time()``
in a worker); the syncer never sleeps and never reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from training.engine.config import OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta, GlobalVersion
from training.engine.outer import OuterOptimizer
from training.engine.transport import Transport, latest_version


@dataclass(frozen=True)
class Decision:
    """What a merge of one fragment would do: (delta id, weight, staleness) and drops."""

    fragment: int
    included: list[tuple[str, float, int]]
    dropped: list[tuple[str, str]] = field(default_factory=list)


class Syncer:
    def __init__(
        self,
        *,
        cfg: SyncerConfig,
        outer: OuterConfig,
        fragments: list[list[str]],
        init: Mapping[str, torch.Tensor],
        transport: Transport | None = None,
        versions: list[int] | None = None,
        publish_initial: bool = True,
    ) -> None:
        self.cfg = cfg
        self.fragments = fragments
        self.transport = transport
        self.params = {n: t.detach().float().clone() for n, t in init.items()}
        self.outer = OuterOptimizer(outer)
        self.version = list(versions) if versions is not None else [0] * len(fragments)
        self.pending: list[list[FragmentDelta]] = [[] for _ in fragments]
        self.quorum_at: list[float | None] = [None] * len(fragments)
        self.consumed: set[str] = set()
        self.history: list[dict[str, Any]] = []
        if transport is not None and publish_initial:
            for f in range(len(fragments)):
                if self.version[f] == 0:
                    transport.publish(self._snapshot(f, [], {"time": 0.0}))

    # ---- resume -------------------------------------------------------------------------
    @classmethod
    def resume(
        cls,
        *,
        cfg: SyncerConfig,
        outer: OuterConfig,
        fragments: list[list[str]],
        transport: Transport,
        init: Mapping[str, torch.Tensor] | None = None,
    ) -> Syncer:
        """A syncer rebuilt from the newest published version of every fragment."""
        params: dict[str, torch.Tensor] = {}
        momentum: dict[str, torch.Tensor] = {}
        versions: list[int] = []
        consumed: set[str] = set()
        for f in range(len(fragments)):
            latest = latest_version(transport, f)
            if latest is None:
                if init is None:
                    raise ValueError(f"fragment {f} has no published version and no init")
                params.update({n: init[n] for n in fragments[f]})
                versions.append(0)
                continue
            params.update(latest.params)
            momentum.update(latest.momentum)
            versions.append(latest.version)
            for v in transport.versions(f):
                consumed.update(transport.get_version(f, v).merged)
        syncer = cls(
            cfg=cfg, outer=outer, fragments=fragments, init=params, transport=transport, versions=versions
        )
        syncer.outer.load_state_dict(momentum)
        syncer.consumed = consumed
        return syncer

    # ---- intake -------------------------------------------------------------------------
    def submit(self, delta: FragmentDelta, now: float) -> bool:
        """Queue a delta; False if it was already consumed or queued (idempotent intake)."""
        f = delta.fragment
        if delta.id in self.consumed or any(d.id == delta.id for d in self.pending[f]):
            return False
        self.pending[f].append(delta)
        if self.quorum_at[f] is None and len(self._fresh_learners(f)) >= self._k():
            self.quorum_at[f] = now
        return True

    def pull(self, now: float) -> int:
        """Submit every delta in the transport not yet seen; returns how many were new."""
        if self.transport is None:
            return 0
        new = 0
        for f in range(len(self.fragments)):
            queued = {d.id for d in self.pending[f]}
            for did in self.transport.delta_ids(f):
                if did not in self.consumed and did not in queued:
                    new += self.submit(self.transport.get_delta(f, did), now)
        return new

    # ---- decisions ----------------------------------------------------------------------
    def _k(self) -> int:
        return self.cfg.quorum if self.cfg.quorum is not None else self.cfg.learners

    def _fresh_learners(self, f: int) -> set[int]:
        return {d.learner for d in self.pending[f] if d.base_version == self.version[f]}

    def ready(self, fragment: int, now: float) -> bool:
        fresh = len(self._fresh_learners(fragment))
        if fresh >= self.cfg.learners:
            return True
        at = self.quorum_at[fragment]
        return fresh >= self._k() and at is not None and now >= at + self.cfg.grace

    def next_deadline(self) -> float | None:
        times = [at + self.cfg.grace for at in self.quorum_at if at is not None]
        return min(times) if times else None

    def decide(self, fragment: int) -> Decision:
        """Weights for the deltas queued on a fragment under the stale policy."""
        included: list[tuple[str, float, int]] = []
        dropped: list[tuple[str, str]] = []
        raw: list[float] = []
        for d in self.pending[fragment]:
            s = self.version[fragment] - d.base_version
            if s > self.cfg.max_staleness:
                dropped.append((d.id, f"staleness {s} > {self.cfg.max_staleness}"))
                continue
            if s > 0 and self.cfg.stale_policy == "drop":
                dropped.append((d.id, f"stale by {s}"))
                continue
            w = float(d.tokens) if self.cfg.token_weighting else 1.0
            raw.append(w * (self.cfg.discount**s))
            included.append((d.id, 0.0, s))
        total = sum(raw) or 1.0
        included = [(i, w / total, s) for (i, _, s), w in zip(included, raw, strict=True)]
        return Decision(fragment=fragment, included=included, dropped=dropped)

    # ---- merging ------------------------------------------------------------------------
    def poll(self, now: float) -> list[GlobalVersion]:
        """Merge every fragment that is ready; returns the versions this call published."""
        return [self.merge(f, now) for f in range(len(self.fragments)) if self.ready(f, now)]

    @torch.no_grad()
    def merge(self, fragment: int, now: float) -> GlobalVersion:
        decision = self.decide(fragment)
        by_id = {d.id: d for d in self.pending[fragment]}
        names = self.fragments[fragment]
        parts = [(by_id[i].decoded(), w) for i, w, _ in decision.included]
        delta = {n: self._combine([(p[n], w) for p, w in parts]) for n in names}
        self.outer.step(self.params, delta)
        merged_ids = [i for i, _, _ in decision.included] + [i for i, _ in decision.dropped]
        tokens = sum(by_id[i].tokens for i, _, _ in decision.included)
        meta = {
            "time": now,
            "tokens": tokens,
            "learners": sorted({by_id[i].learner for i, _, _ in decision.included}),
            "staleness": [s for _, _, s in decision.included],
            "weights": [w for _, w, _ in decision.included],
            "dropped": [i for i, _ in decision.dropped],
        }
        self.version[fragment] += 1
        snap = self._snapshot(fragment, merged_ids, meta)
        if self.transport is not None and not self.transport.publish(snap):
            # Someone (an earlier incarnation of this syncer) already wrote this version:
            # the stored one is the truth, ours is discarded.
            snap = self.transport.get_version(fragment, self.version[fragment])
            for n, t in snap.params.items():
                self.params[n] = t.float().clone()
            self.outer.load_state_dict(snap.momentum)
            merged_ids = snap.merged
        self.consumed.update(merged_ids)
        self.pending[fragment] = [d for d in self.pending[fragment] if d.id not in self.consumed]
        self.quorum_at[fragment] = None
        if len(self._fresh_learners(fragment)) >= self._k():
            self.quorum_at[fragment] = now
        self.history.append({"fragment": fragment, "version": self.version[fragment], **snap.meta})
        return snap

    def _combine(self, parts: list[tuple[torch.Tensor, float]]) -> torch.Tensor:
        """Weighted mean in fp32, or radial-directional averaging."""
        if not self.cfg.radial_directional:
            out = torch.zeros_like(parts[0][0], dtype=torch.float32)
            for t, w in parts:
                out.add_(t.float(), alpha=w)
            return out
        norm = sum(w * float(t.norm()) for t, w in parts)
        direction = torch.zeros_like(parts[0][0], dtype=torch.float32)
        for t, w in parts:
            n = float(t.norm())
            if n > 0:
                direction.add_(t.float(), alpha=w / n)
        d = float(direction.norm())
        return direction * (norm / d) if d > 0 else direction

    def _snapshot(self, fragment: int, merged: list[str], meta: dict[str, Any]) -> GlobalVersion:
        names = self.fragments[fragment]
        return GlobalVersion(
            fragment=fragment,
            version=self.version[fragment],
            params={n: self.params[n].clone() for n in names},
            momentum=self.outer.state_dict(names),
            merged=list(merged),
            meta=dict(meta),
        )

    def global_params(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in self.params.items()}
