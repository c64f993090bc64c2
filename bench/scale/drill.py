"""One drill of one compression kind: M learners × N outer steps through the syncer and store,
then a SIGKILLed syncer and a fresh one that resumes from the store. Figures only; see run.py.

Lockstep, one outer step at a time: every learner catches up and pushes (in parallel), then the
syncer pulls, merges, publishes and sweeps. A decoupled run overlaps these; lockstep makes each
stage's seconds and bytes its own and every version merge all M learners.
"""

from __future__ import annotations

import multiprocessing
import re
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from bench.scale.workers import Spec, learner_main, syncer_main
from storage.objectstore import ObjectStore
from training.engine.transport import object_sizes

_KIND = re.compile(r"(?P<kind>versions|down|deltas)/f(?P<fragment>\d+)/(?P<name>[^/]+)\.syd$")
_CTX = multiprocessing.get_context("spawn")  # a fresh interpreter: its peak RSS is its own


class Child:
    """A drill process and the parent's end of its pipe; a reply that never comes raises."""

    def __init__(self, name: str, target: Callable[..., None], *args: Any) -> None:
        self.name = name
        ours, theirs = _CTX.Pipe()
        self.conn: Connection = ours
        self.process: BaseProcess = _CTX.Process(target=target, args=(theirs, *args), name=name, daemon=True)
        self.process.start()
        theirs.close()  # so that a child's death reads as EOF here

    def send(self, command: str) -> None:
        self.conn.send(command)

    def reply(self) -> dict[str, Any]:
        try:
            got: dict[str, Any] = self.conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(
                f"{self.name} exited with code {self.process.exitcode} (killed for memory? try a smaller --params)"
            ) from None
        return got

    def ask(self, command: str) -> dict[str, Any]:
        self.send(command)
        return self.reply()

    def stop(self) -> dict[str, Any]:
        final = self.ask("stop")
        self.process.join(30)
        return final

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()  # SIGKILL: nothing runs after it, as when a worker is lost
        self.process.join(30)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "mean": round(statistics.fmean(values), 4),
        "median": round(statistics.median(values), 4),
        "max": round(max(values), 4),
    }


def store_breakdown(store: ObjectStore, prefix: str) -> dict[str, Any]:
    """Bytes under the drill's prefix by kind, and the newest version's size (blob + down-delta)."""
    sizes = object_sizes(store, prefix)
    by_kind = {"versions": 0, "down": 0, "deltas": 0, "other": 0}
    newest: dict[int, int] = {}
    for key, size in sizes.items():
        m = _KIND.search(key)
        kind = m["kind"] if m else "other"
        by_kind[kind] += size
        if m and kind == "versions":
            f = int(m["fragment"])
            newest[f] = max(newest.get(f, -1), int(m["name"].lstrip("v")))
    newest_keys = {
        f"{kind}/f{f:03d}/v{v:08d}.syd" for f, v in newest.items() for kind in ("versions", "down")
    }
    return {
        "bytes": sum(sizes.values()),
        "objects": len(sizes),
        "bytes_by_kind": by_kind,
        # The newest version of every fragment: its blob (params, momentum, the learners' copy,
        # the down-delta) and its down-delta object; what K counts in the retention.
        "version_bytes": sum(s for k, s in sizes.items() if any(k.endswith(n) for n in newest_keys)),
        "versions_stored": sum(1 for k in sizes if (m := _KIND.search(k)) and m["kind"] == "versions"),
    }


def _rss_of(*replies: dict[str, Any]) -> int:
    return max(int(r.get("peak_rss_bytes", 0)) for r in replies)


def run_drill(spec: Spec, *, steps: int, store: ObjectStore, log: Callable[[str], None]) -> dict[str, Any]:
    """The drill for ``spec.kind``; ``store`` is the parent's own view of the store, for listings."""
    children: list[Child] = []
    try:
        syncer = Child("syncer", syncer_main, spec, False)
        children.append(syncer)
        learners = [Child(f"learner-{i}", learner_main, spec, i) for i in range(spec.learners)]
        children += learners
        started = syncer.reply()  # version 0 is published
        for c in learners:
            c.send("join")
        joined = [c.reply() for c in learners]
        log(f"{spec.kind}: syncer up in {started['start_s']:.1f} s, {len(learners)} learners joined")

        learner_steps: list[list[dict[str, Any]]] = [[] for _ in learners]
        syncer_steps: list[dict[str, Any]] = []
        for step in range(1, steps + 1):
            for c in learners:
                c.send("step")
            for i, c in enumerate(learners):
                learner_steps[i].append(c.reply())
            syncer_steps.append(syncer.ask("step"))
            s = syncer_steps[-1]
            log(
                f"{spec.kind}: step {step}/{steps}: syncer pull {s['pull_s']:.2f} s, "
                f"merge+publish {s['merge_publish_s']:.2f} s (publish {s['publish_s']:.2f} s), sweep {s['sweep_s']:.2f} s"
            )
        after_steps = store_breakdown(store, spec.prefix)

        # One more push, merged by nobody: the syncer is SIGKILLed with the deltas waiting.
        for c in learners:
            c.send("step")
        extra = [c.reply() for c in learners]
        syncer.kill()
        t0 = time.monotonic()
        resumed = Child("syncer-resumed", syncer_main, spec, True)
        children.append(resumed)
        ready = resumed.reply()
        resume_s = time.monotonic() - t0
        first = resumed.ask("step")
        log(f"{spec.kind}: syncer resumed in {resume_s:.1f} s (Syncer.resume {ready['start_s']:.1f} s)")

        final_learners = [c.stop() for c in learners]
        final_resumed = resumed.stop()
    finally:
        for c in children:
            c.kill()

    return {
        "kind": spec.kind,
        "learners": [
            _learner_figures(joined[i], learner_steps[i], [extra[i], final_learners[i]])
            for i in range(len(learners))
        ],
        "syncer": _syncer_figures(started, syncer_steps),
        "store_after_steps": after_steps,
        "resume": {
            "seconds": round(resume_s, 3),
            "resume_call_seconds": round(ready["start_s"], 3),
            "objects_read": ready["objects_read"],
            "bytes_read": ready["bytes_down"],
            "versions_resumed_at": ready["versions"],
            "deltas_pulled_after_resume": first["new_deltas"],
            "published_after_resume": first["published"],
            "first_step_seconds": round(first["pull_s"] + first["merge_publish_s"], 3),
            "peak_rss_bytes": _rss_of(ready, first, final_resumed),
        },
        "stores": {
            "learners": [r["store"] for r in final_learners],
            "syncer": syncer_steps[-1]["store"] if syncer_steps else started["store"],
            "syncer_resumed": final_resumed["store"],
        },
    }


def _learner_figures(
    joined: dict[str, Any], steps: list[dict[str, Any]], later: list[dict[str, Any]]
) -> dict[str, Any]:
    ups = [s["step_bytes_up"] for s in steps]
    downs = [s["step_bytes_down"] for s in steps if s["step_bytes_down"] > 0]
    return {
        "peak_rss_bytes": _rss_of(joined, *steps, *later),
        "rss_after_join_bytes": joined["peak_rss_bytes"],
        "join_bytes_down": joined["join_bytes_down"],
        "bytes_up_per_sync": round(statistics.fmean(ups)) if ups else 0,
        "payload_bytes_up_per_sync": round(statistics.fmean([s["payload_bytes_up"] for s in steps]))
        if steps
        else 0,
        "bytes_down_per_sync": round(statistics.fmean(downs)) if downs else 0,
        "syncs": len(steps),
        "fetch_seconds": _stats([s["fetch_s"] for s in steps]),
        "push_seconds": _stats([s["push_s"] for s in steps]),
        "bytes_up_total": later[-1]["bytes_up"],
        "bytes_down_total": later[-1]["bytes_down"],
    }


def _syncer_figures(started: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    outer = [s["pull_s"] + s["merge_publish_s"] for s in steps]
    return {
        "peak_rss_bytes": _rss_of(started, *steps),
        "start_seconds": round(started["start_s"], 3),
        "outer_step_seconds": _stats(outer),
        "outer_step_seconds_each": [round(x, 3) for x in outer],
        "pull_seconds": _stats([s["pull_s"] for s in steps]),
        "merge_publish_seconds": _stats([s["merge_publish_s"] for s in steps]),
        # Of which writing the version blobs and down-deltas to the store (the rest: decoding the
        # deltas, the outer step, the down-delta's quantisation and the snapshot's copies).
        "publish_seconds": _stats([s["publish_s"] for s in steps]),
        "merge_seconds": _stats([s["merge_publish_s"] - s["publish_s"] for s in steps]),
        "sweep_seconds": _stats([s["sweep_s"] for s in steps]),
        "bytes_down_per_step": round(statistics.fmean([s["step_bytes_down"] for s in steps])) if steps else 0,
        "bytes_up_per_step": round(statistics.fmean([s["step_bytes_up"] for s in steps])) if steps else 0,
        "versions_published": sum(len(s["published"]) for s in steps),
        "bytes_freed_by_sweeps": sum(s["swept_bytes_freed"] for s in steps),
    }
