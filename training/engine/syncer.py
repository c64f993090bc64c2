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
* Adaptive grace (``adaptive_grace``): the grace window is sized per round from the lags the
  syncer has seen (see :meth:`Syncer.grace_for`), with ``grace`` as its cap.
* The outer optimizer (Nesterov SGD, :mod:`training.engine.outer`) applies Δ and version
  v + 1 is published with its momentum and the ids of the deltas it consumed. Publishing is
  write-once, so a syncer that was killed and resumed (:meth:`Syncer.resume`) never applies
  a delta twice: it restarts from the newest published version and skips consumed ids.
  Each version records the consumed ids that may still be in the store (those the last listing
  showed, and its own), so a resume reads one version per fragment however long the run is.
* The way down is compressed too: each version carries ``down``, the difference between the
  new parameters and the *mirror* (the copy every learner holds), quantised like the Δs, and
  the new mirror (old mirror + decoded ``down``). See :meth:`Syncer._down`.
* Offloaded state (``offload=True``, with a transport): a fragment's parameters, mirror and
  momentum are exactly what its newest published version holds, so the syncer keeps none of
  them between merges. A merge reads the fragment's newest version, applies the merge, publishes
  the next one and lets go of it: memory is one fragment's state (3 × its fp32 size) instead of
  the whole model's three times over, and a resume reads each version's header only. The price
  is one read of the fragment's version blob per merge. ``merge`` then returns the version
  without its tensors (they are in the store).

Time is whatever the caller says it is (virtual seconds in the simulator, ``time.time()``
in a worker); the syncer never sleeps and never reads a clock.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from training.engine.compression import EncodedTensor, decode, encode
from training.engine.config import CompressionKind, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta, GlobalVersion
from training.engine.outer import OuterOptimizer
from training.engine.syncer_resume import resume_offloaded, resume_resident
from training.engine.transport import Transport


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
        down: CompressionKind = "fp32",
        mirror: Mapping[str, torch.Tensor] | None = None,
        owned: bool = False,
        offload: bool = False,
    ) -> None:
        """`owned`: `init` and `mirror` are this syncer's to keep (resume read them for it), so
        they are taken as they are instead of copied; otherwise the caller keeps its tensors.
        `offload` (with a transport): keep no fragment's state between merges (module docstring);
        `init` is then read only to publish the version 0s."""
        self.cfg = cfg
        self.fragments = fragments
        self.transport = transport
        self.offload = offload and transport is not None
        self.resident: set[int] = set()  # offloaded: the fragments whose state is loaded now
        own = (lambda t: t.detach().float()) if owned else (lambda t: t.detach().float().clone())
        self.params = {} if self.offload else {n: own(t) for n, t in init.items()}
        self.down_kind: CompressionKind = down
        if self.offload:
            self.mirror: dict[str, torch.Tensor] = {}
        elif mirror is not None:
            # Never one tensor for both: a blob without a mirror has its params as the mirror.
            self.mirror = {n: own(mirror[n]) for n in self.params}
            for n, t in self.mirror.items():
                if t.data_ptr() == self.params[n].data_ptr():
                    self.mirror[n] = t.clone()
        else:
            self.mirror = {n: t.clone() for n, t in self.params.items()}
        self.outer = OuterOptimizer(outer)
        self.version = list(versions) if versions is not None else [0] * len(fragments)
        self.pending: list[list[FragmentDelta]] = [[] for _ in fragments]
        self.quorum_at: list[float | None] = [None] * len(fragments)
        self.consumed: set[str] = set()
        # Per fragment: the delta ids the last pull listed (None before the first), and each
        # learner's (seq, base version) of its newest delta seen: what it holds at least.
        self.listed: list[set[str] | None] = [None] * len(fragments)
        self.bases: list[dict[int, tuple[int, int]]] = [{} for _ in fragments]
        self.history: list[dict[str, Any]] = []
        # Adaptive grace: per learner, a running estimate of how long after a round's quorum
        # its delta arrives; per (fragment, version), when that round reached its quorum.
        self.lag: dict[int, float] = {}
        self.round_quorum_at: dict[tuple[int, int], float] = {}
        if transport is not None and publish_initial:
            for f in range(len(fragments)):
                if self.version[f] == 0:
                    first = self.initial_version(f, init, mirror) if self.offload else None
                    transport.publish(first or self._snapshot(f, [], {"time": 0.0}))

    def initial_version(
        self, fragment: int, init: Mapping[str, torch.Tensor], mirror: Mapping[str, torch.Tensor] | None
    ) -> GlobalVersion:
        """Version 0 of a fragment straight from the caller's tensors (offloaded: nothing kept)."""
        names = self.fragments[fragment]
        return GlobalVersion(
            fragment=fragment,
            version=0,
            params={n: init[n].detach().float() for n in names},
            momentum={},
            meta={"time": 0.0},
            mirror={n: (mirror if mirror is not None else init)[n].detach().float() for n in names},
        )

    # ---- offloaded state ----------------------------------------------------------------
    def _load(self, fragment: int) -> None:
        """Offloaded: read the fragment's state from its newest version (no-op when resident)."""
        if not self.offload or fragment in self.resident:
            return
        assert self.transport is not None  # noqa: S101 (offload needs one)
        stored = self.transport.get_version(fragment, self.version[fragment])
        self.params.update({n: t.float() for n, t in stored.params.items()})
        # Never one tensor for both: params change in place, the mirror by replacement.
        self.mirror.update(
            {n: t.float() if stored.mirror else t.float().clone() for n, t in stored.held.items()}
        )
        self.outer.load_state_dict(stored.momentum, owned=True)
        self.resident.add(fragment)

    def _evict(self, fragment: int) -> None:
        """Offloaded: let go of a fragment's state (its newest version holds it)."""
        if not self.offload:
            return
        for n in self.fragments[fragment]:
            self.params.pop(n, None)
            self.mirror.pop(n, None)
            self.outer.momentum.pop(n, None)
        self.resident.discard(fragment)
        release_freed_memory()

    # ---- resume (training.engine.syncer_resume) ------------------------------------------
    @classmethod
    def resume(
        cls,
        *,
        cfg: SyncerConfig,
        outer: OuterConfig,
        fragments: list[list[str]],
        transport: Transport,
        init: Mapping[str, torch.Tensor] | None = None,
        down: CompressionKind = "fp32",
        offload: bool = False,
    ) -> Syncer:
        """A syncer rebuilt from the newest published version of every fragment.

        It reads that one version per fragment (offloaded: its header only): the version lists
        the consumed deltas still in the store (``meta["consumed"]``), so the first ``pull``
        reads only the pending ones. Versions written before that list existed are all read
        for their ``merged`` ids.
        """
        how = resume_offloaded if offload else resume_resident
        return how(cls, cfg=cfg, outer=outer, fragments=fragments, transport=transport, init=init, down=down)

    # ---- intake -------------------------------------------------------------------------
    def submit(self, delta: FragmentDelta, now: float) -> bool:
        """Queue a delta; False if it was already consumed or queued (idempotent intake)."""
        f = delta.fragment
        if delta.id in self.consumed or any(d.id == delta.id for d in self.pending[f]):
            return False
        self.pending[f].append(delta)
        seen = self.bases[f].get(delta.learner)
        if seen is None or delta.seq > seen[0]:
            self.bases[f][delta.learner] = (delta.seq, delta.base_version)
        self._observe_lag(delta, now)
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
            listed = set(self.transport.delta_ids(f))
            for did in sorted(listed):
                if did not in self.consumed and did not in queued:
                    new += self.submit(self.transport.get_delta(f, did), now)
            # A consumed delta gone from the store (the retention sweep deleted it) cannot come
            # back (ids are never reused), so it need not be remembered.
            self.consumed -= {i for i in self._consumed_of(f) if i not in listed}
            self.listed[f] = listed
        return new

    def _consumed_of(self, fragment: int) -> set[str]:
        head = f"-f{fragment:03d}-"  # FragmentDelta.id
        return {i for i in self.consumed if head in i}

    def stored_consumed(self, fragment: int) -> list[str]:
        """The consumed deltas of a fragment that may still be in the store: those the last pull
        listed (all that are remembered, before a first pull)."""
        listed = self.listed[fragment]
        return sorted(i for i in self._consumed_of(fragment) if listed is None or i in listed)

    def spent_deltas(self, fragment: int) -> list[str]:
        """Consumed deltas of a fragment the store may delete: every one the last pull listed,
        except each learner's newest (a chunk run again after a crash reconciles its pushes
        against that one: training.run_pushes.reconcile_pushes)."""
        listed = self.listed[fragment] or set()
        newest: dict[str, tuple[int, str]] = {}
        for i in listed:
            learner, _, seq = i.rpartition("-s")
            newest[learner] = max(newest.get(learner, (-1, "")), (int(seq), i))
        keep = {i for _, i in newest.values()}
        return sorted(i for i in self._consumed_of(fragment) if i in listed and i not in keep)

    def learner_bases(self, fragment: int) -> dict[int, int]:
        """Per learner, the base version of its newest delta seen on a fragment: it holds that
        version or a newer one, and follows the down-deltas after it to the newest."""
        return {j: base for j, (_, base) in self.bases[fragment].items()}

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
        return fresh >= self._k() and at is not None and now >= at + self.grace_for(fragment)

    def next_deadline(self) -> float | None:
        times = [at + self.grace_for(f) for f, at in enumerate(self.quorum_at) if at is not None]
        return min(times) if times else None

    # ---- adaptive grace -----------------------------------------------------------------
    # Decoupled DiLoCo (arXiv 2604.21428) merges on a minimum quorum and then admits late
    # learners within an *adaptive* grace window. The abstract names the mechanism; its exact
    # rule was not available to us, so this is our own: wait only for learners whose delta is
    # expected within the cap (``cfg.grace``), and only as long as the latest of them is
    # expected. Each learner's expected lag (seconds after a round's quorum) is an exponential
    # average of what the syncer observed: 0 for a delta that was part of the quorum, the
    # time after the quorum for one that came inside the window, and for a delta that came
    # after its round was merged (stale), the time since that round's quorum. A learner with
    # no history gets the whole cap (the fixed window), a dead or slow one stops costing the
    # others anything once its estimate exceeds the cap, and a learner that speeds up is
    # waited for again as soon as one fresh delta of it lands in a window.
    LAG_SMOOTHING = 0.5  # weight of the newest observation
    GRACE_MARGIN = 1.25  # wait this much longer than the latest expected arrival

    def grace_for(self, fragment: int) -> float:
        """Seconds to wait after this fragment's quorum before merging."""
        cap = self.cfg.grace
        if not self.cfg.adaptive_grace:
            return cap
        fresh = self._fresh_learners(fragment)
        expected = []
        for j in range(self.cfg.learners):
            if j in fresh:
                continue
            lag = self.lag.get(j)
            if lag is None:
                return cap
            if lag <= cap:
                expected.append(lag)
        return min(cap, max(expected) * self.GRACE_MARGIN) if expected else 0.0

    def _observe_lag(self, delta: FragmentDelta, now: float) -> None:
        f = delta.fragment
        if delta.base_version == self.version[f]:
            at = self.quorum_at[f]
            lag = max(0.0, now - at) if at is not None else 0.0
        else:
            at = self.round_quorum_at.get((f, delta.base_version))
            if at is None:
                return
            lag = max(0.0, now - at)
        old = self.lag.get(delta.learner)
        a = self.LAG_SMOOTHING
        self.lag[delta.learner] = lag if old is None else a * lag + (1.0 - a) * old

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
        self._load(fragment)
        by_id = {d.id: d for d in self.pending[fragment]}
        # Tensor by tensor: each included delta's tensor is decoded, combined and applied before
        # the next tensor's, so a merge holds one tensor of each delta decoded, not M whole
        # fragments and their combined delta (the arithmetic is the same, per tensor).
        # Every included delta must carry every tensor before the first one is applied.
        for i, _, _ in decision.included:
            missing = [n for n in self.fragments[fragment] if n not in by_id[i].tensors]
            if missing:
                raise ValueError(
                    f"delta {i} lacks {len(missing)} tensors of fragment {fragment}: {missing[:3]}"
                )
        for n in self.fragments[fragment]:
            parts = [(decode(by_id[i].tensors[n]), w) for i, w, _ in decision.included]
            self.outer.step(self.params, {n: self._combine(parts)})
        merged_ids = [i for i, _, _ in decision.included] + [i for i, _ in decision.dropped]
        tokens = sum(by_id[i].tokens for i, _, _ in decision.included)
        quorum_at = self.quorum_at[fragment]
        meta = {
            "time": now,
            "tokens": tokens,
            "learners": sorted({by_id[i].learner for i, _, _ in decision.included}),
            "staleness": [s for _, _, s in decision.included],
            "weights": [w for _, w, _ in decision.included],
            "dropped": [i for i, _ in decision.dropped],
            "grace": self.grace_for(fragment),
            "lags": {str(j): lag for j, lag in sorted(self.lag.items())},
            "bytes_in": sum(by_id[i].nbytes for i in merged_ids),
            # What a resumed syncer must still skip: the consumed deltas the store may hold.
            "consumed": sorted(set(self.stored_consumed(fragment)) | set(merged_ids)),
            "bases": {str(j): list(sb) for j, sb in sorted(self.bases[fragment].items())},
        }
        if quorum_at is not None:
            self.round_quorum_at[(fragment, self.version[fragment])] = quorum_at
            for key in [k for k in self.round_quorum_at if k[0] == fragment]:
                if key[1] < self.version[fragment] - self.cfg.max_staleness:
                    del self.round_quorum_at[key]
        self.version[fragment] += 1
        down = self._down(fragment)
        # Offloaded, the state is let go of right after publishing: the snapshot need not copy it.
        snap = self._snapshot(fragment, merged_ids, meta, down, copy=not self.offload)
        if self.transport is not None and not self.transport.publish(snap):
            # Someone (an earlier incarnation of this syncer) already wrote this version:
            # the stored one is the truth, ours is discarded.
            if self.offload:
                snap = self.transport.version_header(fragment, self.version[fragment])
            else:
                snap = self.transport.get_version(fragment, self.version[fragment])
                for n, t in snap.params.items():
                    self.params[n] = t.float().clone()
                for n, t in snap.held.items():
                    self.mirror[n] = t.float().clone()
                self.outer.load_state_dict(snap.momentum)
            merged_ids = snap.merged
        if self.offload:
            self._evict(fragment)
            snap = GlobalVersion(snap.fragment, snap.version, {}, {}, list(snap.merged), dict(snap.meta))
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

    @torch.no_grad()
    def _down(self, fragment: int) -> dict[str, EncodedTensor]:
        """The new version as learners receive it; moves the mirror to what they will hold.

        down = Q(θ_new − mirror) and mirror ← mirror + decode(down). Learners hold the mirror
        of the previous version, add the same decoded tensor in the same fp32 arithmetic and
        so hold the new mirror bitwise. This is error feedback on the way down: the residual
        θ − mirror that quantisation leaves is not lost, it is part of the next version's
        down-delta, so the learners' copy never drifts further from θ than one quantisation
        step of one down-delta (tested). It is the server half of the two-way
        error-compensated compression of DoubleSqueeze (Tang et al., arXiv 1905.05957,
        Algorithm 1), applied to the model difference rather than to a gradient. We keep it
        instead of a periodic fp32 resend because it costs no extra bytes and bounds the
        drift at every version, not only after each resend.
        """
        down: dict[str, EncodedTensor] = {}
        for n in self.fragments[fragment]:
            enc = encode(self.params[n] - self.mirror[n], self.down_kind)
            self.mirror[n] = self.mirror[n] + decode(enc)
            down[n] = enc
        return down

    def _snapshot(
        self,
        fragment: int,
        merged: list[str],
        meta: dict[str, Any],
        down: dict[str, EncodedTensor] | None = None,
        *,
        copy: bool = True,
    ) -> GlobalVersion:
        """The fragment's state as a version; `copy=False` shares the tensors (for a state the
        syncer lets go of right after publishing it)."""
        names = self.fragments[fragment]
        keep = (lambda t: t.clone()) if copy else (lambda t: t)
        return GlobalVersion(
            fragment=fragment,
            version=self.version[fragment],
            params={n: keep(self.params[n]) for n in names},
            momentum={n: keep(self.outer.momentum[n]) for n in names if n in self.outer.momentum},
            merged=list(merged),
            meta=dict(meta),
            mirror={n: keep(self.mirror[n]) for n in names},
            down=dict(down or {}),
        )

    def global_params(self) -> dict[str, torch.Tensor]:
        if self.offload:
            assert self.transport is not None  # noqa: S101 (offload needs one)
            found: dict[str, torch.Tensor] = {}
            for f, v in enumerate(self.version):
                found.update(self.transport.get_version(f, v).params)
            return found
        return {n: t.clone() for n, t in self.params.items()}


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's malloc_trim; nothing elsewhere).

    Tensors below glibc's mmap threshold (up to 32 MiB once it has adapted) live on the heap,
    and freeing them does not shrink the process: without this an offloaded syncer's RSS kept
    the previous fragment's pages while it loaded the next (measured with bench scale: about
    one more copy of the model in fp32 at the peak)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): nothing to trim
        return None


_LIBC = _libc()
