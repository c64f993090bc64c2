"""Scale drill: real tensor sizes through the real syncer and store, with tiny compute.

    python manage.py bench scale --json var/bench-scale.json            # 5e7 params, moto S3
    python manage.py bench scale --params 1e8 --steps 5 --json var/bench-scale-1e8.json
    python manage.py bench scale --store file:///tmp/scale --params 2e6 --steps 3

A synthetic fp32 model of ``--params`` parameters (transformer-shaped: bench.scale.model) is
split into fragments as a run splits them; M learners and the syncer run as separate processes
(bench.scale.workers) through training.engine's Syncer and ObjectStoreTransport, against moto's
S3 server on loopback (multipart above the part size, SWITCHYARD_OBJECT_STORE_PART_BYTES or
``--part-bytes``) or ``--store``. Each compression kind gets a full drill (bench.scale.drill):
N outer steps with the retention sweep on, then the syncer is SIGKILLed and a fresh one resumes.

Reported per kind: peak RSS of every process, bytes per sync each way per learner (measured by
the transport, blob headers included), store bytes after the steps against (K + 2) × the
version size, the syncer's outer-step seconds (pull + merge + publish; the sweep apart), the
resume time, and every PUT (S3 requests counted from the client's own events). The targets are
reported as figures with a ``*_target_met`` flag, never asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from bench.meta import run_meta
from bench.scale.drill import run_drill
from bench.scale.model import Shapes, fragments_of, numel, synthetic_shapes
from bench.scale.workers import Spec, StoreServer
from storage.multipart import transfer_from_env
from storage.objectstore import ObjectStore, open_store
from training.engine.config import CompressionKind
from training.run_config.schema import DEFAULTS

GIB = 1 << 30
SINGLE_PUT_LIMIT_BYTES = 5 * GIB  # S3 refuses a single PUT (and a part) above 5 GiB
RESUME_LIMIT_SECONDS = 60.0
BUCKET = "switchyard-bench-scale"
KINDS = ("fp32", "bf16", "int8", "4bit", "fp4_e3m0")
ALIASES = {"int4": "4bit", "fp4": "fp4_e3m0"}
# Peak RSS per fp32 byte of the model, measured by this drill at 1e8 parameters in 4 fragments
# (bench scale --params 1e8 --steps 5, 7 December 2026, the syncer offloaded and learners reading
# mirrors only): the syncer 3.1x, moto's server 5.6x, a learner 2.6x (each with its process's
# torch baseline, so an overestimate at larger sizes). Used only to refuse a drill that would
# not fit in this machine's memory (--force runs it).
RSS_PER_FP32 = {"syncer": 3.1, "store_server": 5.6, "learner": 2.6}
UPLOADER = (
    "none: there is no separate uploader process; each learner and the syncer put their own "
    "blobs (storage.multipart sends a large object's parts on a thread pool inside that process)"
)


def _kind(text: str) -> str:
    kind = ALIASES.get(text, text)
    if kind not in KINDS:
        raise argparse.ArgumentTypeError(f"unknown compression {text!r}; choose from {', '.join(KINDS)}")
    return kind


def _parser() -> argparse.ArgumentParser:
    syncer = DEFAULTS["syncer"]
    p = argparse.ArgumentParser(prog="manage.py bench scale", description=__doc__.splitlines()[0])
    p.add_argument("--params", type=float, default=5e7, help="model size in parameters (default 5e7)")
    p.add_argument("--steps", type=int, default=20, help="outer steps (default 20)")
    p.add_argument("--learners", type=int, default=2, help="learner processes (default 2)")
    p.add_argument(
        "--compression",
        type=_kind,
        nargs="+",
        default=["4bit", "int8"],
        help="kinds, one full drill each (default: 4bit int8; int4 means 4bit)",
    )
    p.add_argument(
        "--keep-versions",
        type=int,
        default=syncer["keep_versions"],
        help=f"K, versions the retention keeps per fragment (default {syncer['keep_versions']}, the run config's)",
    )
    p.add_argument(
        "--fragments",
        type=int,
        default=4,
        help="fragments (default 4: at 1e9 one fragment is a 12 GB version blob; at most the blocks)",
    )
    p.add_argument("--store", help="file:///dir or s3://bucket[/prefix] instead of moto on loopback")
    p.add_argument("--endpoint-url", help="the S3 endpoint for an s3:// --store")
    p.add_argument("--part-bytes", type=int, help="multipart part size (default: the environment's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="run even where the drill may not fit in memory")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    return p


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set variables for the drill's processes (spawned children inherit them), then restore."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }


def _memory_needed(fp32: int, learners: int, moto: bool) -> int:
    """A rough peak for all the drill's processes at once (RSS_PER_FP32)."""
    per = RSS_PER_FP32["syncer"] + learners * RSS_PER_FP32["learner"]
    return int(fp32 * (per + (RSS_PER_FP32["store_server"] if moto else 0.0)))


def _memory_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            lines = fh.readlines()
    except OSError:
        return None  # not Linux: the guard is skipped
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _log(line: str) -> None:
    sys.stderr.write(f"bench scale: {line}\n")
    sys.stderr.flush()


def _clear(store: ObjectStore, prefix: str) -> None:
    for key in store.list(prefix + "/"):
        store.delete(key)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    moto = args.store is None
    if moto and importlib.util.find_spec("moto") is None:
        sys.stderr.write(
            "bench scale: moto is not installed (a dev requirement): run `make install-dev`, "
            "or pass --store file:///path to use the chunked-file store\n"
        )
        return 2
    started = time.monotonic()
    shapes = synthetic_shapes(args.params)
    fragment_count = max(1, min(args.fragments, shapes.layers))
    fragments = fragments_of(shapes, fragment_count)
    needed, available = _memory_needed(shapes.fp32_bytes, args.learners, moto), _memory_available()
    if available is not None and needed > available and not args.force:
        sys.stderr.write(
            f"bench scale: {shapes.params:,} parameters need about {needed / GIB:.0f} GiB at once "
            f"(syncer, learners{', moto' if moto else ''}) and {available / GIB:.0f} GiB is available: "
            "pass a smaller --params or --force\n"
        )
        return 2
    env = {"SWITCHYARD_OBJECT_STORE_PART_BYTES": str(args.part_bytes)} if args.part_bytes else {}
    if moto:
        env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        env |= {"AWS_DEFAULT_REGION": "us-east-1"}
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    runs: dict[str, Any] = {}
    server_rss: int | None = None
    with _environment(env):
        transfer = transfer_from_env()
        server = StoreServer(BUCKET) if moto else None
        try:
            endpoint = server.url if server is not None else args.endpoint_url
            store_url = f"s3://{BUCKET}" if moto else args.store
            store = open_store(store_url, endpoint_url=endpoint)
            for kind in args.compression:
                spec = Spec(
                    store_url=store_url,
                    endpoint_url=endpoint,
                    prefix=f"bench-scale/{run_id}/{kind}",
                    shapes=shapes,
                    fragments=fragments,
                    learners=args.learners,
                    kind=cast(CompressionKind, kind),
                    keep_versions=args.keep_versions,
                    max_staleness=DEFAULTS["syncer"]["max_staleness"],
                    seed=args.seed,
                    learner_threads=max(1, (os.cpu_count() or 1) // args.learners),
                )
                _log(f"{kind}: {shapes.params:,} params in {fragment_count} fragments, {args.steps} steps")
                try:
                    runs[kind] = run_drill(spec, steps=args.steps, store=store, log=_log)
                finally:
                    _clear(store, spec.prefix)  # the drill's own objects only
            if server is not None:
                server_rss = server.peak_rss_bytes()
        finally:
            if server is not None:
                server.stop()
    report = _report(args, shapes, fragments, runs, transfer.part_bytes, transfer.concurrency, server_rss)
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


def _puts(run: dict[str, Any]) -> dict[str, int]:
    """Every write of one drill, all processes together."""
    counters = [*run["stores"]["learners"], run["stores"]["syncer"], run["stores"]["syncer_resumed"]]
    s3 = [c["s3"] for c in counters if c["s3"] is not None]
    out = {
        "objects_written": sum(c["objects_written"] for c in counters),
        "largest_object_bytes": max(c["largest_object_bytes"] for c in counters),
    }
    if s3:
        out |= {
            "put_count": sum(c["put_object_requests"] + c["upload_part_requests"] for c in s3),
            "put_object_requests": sum(c["put_object_requests"] for c in s3),
            "upload_part_requests": sum(c["upload_part_requests"] for c in s3),
            "multipart_uploads": sum(c["multipart_uploads"] for c in s3),
            "largest_single_put_bytes": max(c["largest_put_bytes"] for c in s3),
        }
    else:  # file://: one write per object, no multipart
        out |= {
            "put_count": out["objects_written"],
            "multipart_uploads": 0,
            "largest_single_put_bytes": out["largest_object_bytes"],
        }
    return out


def _report(
    args: argparse.Namespace,
    shapes: Shapes,
    fragments: list[list[str]],
    runs: dict[str, Any],
    part_bytes: int,
    concurrency: int,
    server_rss: int | None,
) -> dict[str, Any]:
    fp32 = shapes.fp32_bytes
    k = args.keep_versions
    rss_limit = int(1.5 * fp32) + GIB
    figures: dict[str, Any] = {}
    for kind, run in runs.items():
        run["puts"] = _puts(run)
        store = run["store_after_steps"]
        store["bound_bytes"] = (k + 2) * store["version_bytes"]
        learners = run["learners"]
        figures[kind] = {
            "bytes_up_per_sync_per_learner": round(
                sum(x["bytes_up_per_sync"] for x in learners) / len(learners)
            ),
            "bytes_down_per_sync_per_learner": round(
                sum(x["bytes_down_per_sync"] for x in learners) / len(learners)
            ),
            "peak_rss_bytes": {
                "learner": max(x["peak_rss_bytes"] for x in learners),
                "syncer": run["syncer"]["peak_rss_bytes"],
                "syncer_resumed": run["resume"]["peak_rss_bytes"],
            },
            "store_bytes_after_steps": store["bytes"],
            "version_bytes": store["version_bytes"],
            "syncer_outer_step_seconds_mean": run["syncer"]["outer_step_seconds"].get("mean"),
            "resume_seconds": run["resume"]["seconds"],
            "put_count": run["puts"]["put_count"],
            "multipart_uploads": run["puts"]["multipart_uploads"],
            "largest_single_put_bytes": run["puts"]["largest_single_put_bytes"],
        }
    worst_put = max((f["largest_single_put_bytes"] for f in figures.values()), default=0)
    worst_rss = max((max(f["peak_rss_bytes"].values()) for f in figures.values()), default=0)
    worst_resume = max((f["resume_seconds"] for f in figures.values()), default=0.0)
    store_ok = all(
        r["store_after_steps"]["bytes"] <= r["store_after_steps"]["bound_bytes"] for r in runs.values()
    )
    return {
        "benchmark": "scale",
        "meta": run_meta(),
        "machine": _machine(),
        "scale": {
            "params_requested": args.params,
            "params": shapes.params,
            "fp32_bytes": fp32,
            "d_model": shapes.d_model,
            "layers": shapes.layers,
            "vocab": shapes.vocab,
            "tensors": len(shapes.tensors),
            "fragments": len(fragments),
            "fragment_params": [sum(numel(shapes.tensors[n]) for n in names) for names in fragments],
        },
        "setup": {
            "learners": args.learners,
            "steps": args.steps,
            "keep_versions": k,
            "max_staleness": DEFAULTS["syncer"]["max_staleness"],
            "store": "moto S3 server on loopback" if args.store is None else args.store,
            "part_bytes": part_bytes,
            "concurrency": concurrency,
            "compression": list(runs),
            "compression_mode": "one full drill per kind: its own learners, syncer, store prefix and resume",
            "schedule": "lockstep: all learners catch up and push, then the syncer pulls, merges, publishes, sweeps",
        },
        "uploader_process": UPLOADER,
        "store_server_peak_rss_bytes": server_rss,
        "figures": figures,
        "targets": {
            "largest_single_put_bytes": worst_put,
            "largest_single_put_limit_bytes": SINGLE_PUT_LIMIT_BYTES,
            "largest_single_put_target_met": worst_put <= SINGLE_PUT_LIMIT_BYTES,
            "peak_rss_bytes": worst_rss,
            "peak_rss_limit_bytes": rss_limit,
            "peak_rss_limit": "1.5 × the model's fp32 bytes + 1 GiB, for the learner and syncer processes",
            "peak_rss_target_met": worst_rss <= rss_limit,
            "store_bytes_after_steps": {kind: r["store_after_steps"]["bytes"] for kind, r in runs.items()},
            "store_bytes_limit_bytes": {
                kind: r["store_after_steps"]["bound_bytes"] for kind, r in runs.items()
            },
            "store_bytes_limit": "(K + 2) × the newest version's bytes (its blob and down-delta, all fragments)",
            "store_bytes_target_met": store_ok,
            "resume_seconds": worst_resume,
            "resume_limit_seconds": RESUME_LIMIT_SECONDS,
            "resume_target_met": worst_resume <= RESUME_LIMIT_SECONDS,
        },
        "runs": runs,
        "caveats": _caveats(args, shapes, fragments),
    }


def _caveats(args: argparse.Namespace, shapes: Shapes, fragments: list[list[str]]) -> list[str]:
    notes = [
        "synthetic deltas: seeded noise of each tensor's shape, no forward, backward or optimizer",
        "a real learner also holds its parameters, anchors and two AdamW moments (about 5x the fp32 "
        "model) and encodes a fragment's fp32 delta whole (Learner.make_delta); the drill's learner "
        "holds its copy of the global model and encodes tensor by tensor, so its RSS is the "
        "transport side's floor, not a training learner's",
        "lockstep schedule: a decoupled run overlaps pushes and merges and may merge stale deltas",
        "retention without the database: the newest K versions and the learners' bases within "
        "max_staleness; no registry pins (a shipped run keeps every register_every_versions-th "
        "version too), no recorded-version guard, and no learner checkpoints (about 5x the model "
        "per learner, two kept) in the store",
        "resume seconds: from spawning a fresh syncer process (interpreter and torch import "
        "included) to Syncer.resume returning; the killed syncer left one delta per learner and "
        "fragment waiting, which the resumed one pulls and merges (deltas_pulled_after_resume)",
        "every process runs on this one machine: the learners and the syncer share its CPUs, memory and disk",
        "1 GB in the RSS target is read as 1 GiB, 5 GB in the PUT target as 5 GiB (S3's limit)",
    ]
    if args.store is None:
        notes.append(
            "moto's S3 server on loopback: no network latency or bandwidth limit; moto builds a "
            "completed multipart object in memory (about twice its size at once) and reads a whole "
            "object for every ranged GET, so its RSS and the read times of large objects are moto's"
        )
    elif args.store.startswith("file://"):
        notes.append("file:// store: no HTTP and no multipart; a PUT is one object written whole")
    if len(fragments) < args.fragments:
        notes.append(
            f"{args.fragments} fragments asked, {len(fragments)} made: the model has {shapes.layers} blocks"
        )
    return notes
