"""Benchmark: DiLoCo runs through Switchyard's orchestration, with and without a cluster failure.

python manage.py bench training --json var/bench-training.json [--outer-steps N] [--keep] [--ddp-only]
    [--fast-health]

The workers, beat and supervisor run with the shipped health timings (stack/settings/__init__.py's
defaults: heartbeat 5 s, degraded 15 s, down 30 s, supervisor every 3 s), and the JSON says so
(`health_timings.profile`: "shipped"); `--fast-health` (heartbeat 1 s, down 6 s, supervisor 1 s)
is a quicker look whose failover figures are labelled "fast" and are not the product's.

Against the configured database, broker and object store it registers three scratch clusters
(prices 1.00 < 1.50 < 3.00 per accelerator-hour, one learner slot each), starts one
`manage.py worker --cluster` per cluster, the control worker and beat, and runs the same small
job twice (2 learners, quorum 1):

1. plain: the learners go to the two cheapest clusters;
2. failure: once the run has done about a third of the plain run's outer steps, the cheapest
   cluster's worker is SIGKILLed; it is restarted a third of the plain run's duration later
   (not before the failover was detected).
   The supervisor fails its learner over to the third cluster.

Right before and right after the plain run it trains the same learners with the bare engine for
BARE_SECONDS (one process per learner, the syncer in this one, a file:// transport; no broker,
no database; same model, batch, H, quorum; the workers sit idle meanwhile), so the comparison
sees the same background load on this shared machine as the plain run did, and reports:

* orchestration_overhead_ratio: the learners' tokens/s under Switchyard (all tokens they
  trained ÷ the time from the first chunk's start to the last chunk's end, so model and corpus
  loads, broker dispatch gaps, pushes, database writes and the control worker's CPU all count)
  ÷ the bare engine's tokens/s with the same learners (one process per learner with one torch
  thread, as each worker has; its clock starts after setup, so the ratio charges Switchyard
  for each worker's model build and corpus load: conservative);
* failover_detect_s: SIGKILL → the training FailoverEvent's detected_at;
* failover_recover_s: SIGKILL → the re-placed learner training again (its recovered_at);
* goodput_with_failure: tokens merged per wall-second with the failure ÷ without;
* loss_ratio_with_failure: final eval loss with the failure ÷ without;
* ddp_loss_ratio: a learner of 2 gloo ranks ÷ 1 rank, eval loss at the same global batch and
  steps (bench.training.ddp; no workers involved);
* fsdp_loss_ratio: the same with the 2 ranks sharding the learner (FSDP2 over gloo,
  learners.sharding: fsdp): each rank holds half of the parameters and AdamW state;
* ddp_group_start_s / ddp_group_start_kept_s: seconds a chunk of that 2-rank learner waits for
  its other rank, when the helper is started for it / when the worker kept the learner's group
  from its previous chunk (measured, same process);
* resume_loss_ratio: a learner stopped half-way, checkpointed and resumed in a fresh Learner ÷
  the same learner uninterrupted, same tokens (bench.training.resume; no workers;
  ``--ddp-only`` runs just these three figures).

The scratch clusters are marked draining at the end so they take no later work (--keep leaves
them as they are). Benchmarks measure; tests never assert on these figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import close_old_connections
from django.db.models import F, Max, Min, Sum
from django.utils import timezone

from bench.training.bare import bare_engine_run
from bench.training.ddp import ddp_bench
from bench.training.resume import resume_bench
from billing.models import Unit
from billing.services import price_book_publish
from registry.models import Cluster, FailoverEvent, Provider
from registry.services import cluster_set_draining
from training.models import GlobalVersionRecord, LearnerChunk, TrainingLearner, TrainingRun
from training.run_config import run_config_validate
from training.services import training_run_create

# The health timings the workers, beat and supervisor run with. "shipped" is every default of
# stack/settings/__init__.py (heartbeat 5 s, degraded after 15 s, down after 30 s, health check every
# 5 s, supervisor every 3 s), set explicitly so the caller's environment cannot change them;
# "fast" (--fast-health) is for a quick look only and its failover figures are not the product's.
HEALTH_PROFILES = {
    "shipped": {
        "SWITCHYARD_HEARTBEAT_SECONDS": "5",
        "SWITCHYARD_DEGRADED_AFTER_SECONDS": "15",
        "SWITCHYARD_DOWN_AFTER_SECONDS": "30",
        "SWITCHYARD_HEALTH_CHECK_SECONDS": "5",
        "SWITCHYARD_TRAINING_SUPERVISE_SECONDS": "3",
    },
    "fast": {
        "SWITCHYARD_HEARTBEAT_SECONDS": "1",
        "SWITCHYARD_DEGRADED_AFTER_SECONDS": "3",
        "SWITCHYARD_DOWN_AFTER_SECONDS": "6",
        "SWITCHYARD_HEALTH_CHECK_SECONDS": "1",
        "SWITCHYARD_TRAINING_SUPERVISE_SECONDS": "1",
    },
}
PRICES = (Decimal("1.00"), Decimal("1.50"), Decimal("3.00"))
BARE_SECONDS = 20.0


# The run's own timings. "shipped" leaves them to the run-config defaults
# (training/run_config/schema.py: chunk 20 s, learner timeout 90 s, syncer grace 5 s), so the
# failover figures are what a user's run gets; "fast" shortens them with the health timings.
RUN_TIMINGS = {
    "shipped": {},
    "fast": {"syncer": {"grace_seconds": 0.5}, "chunk_seconds": 6.0, "learner_timeout": 20.0},
}


def bench_config(*, outer_steps: int, region: str, profile: str = "shipped") -> dict[str, Any]:
    """The benchmark's run (in the installation's object store, OBJECT_STORE_URL, as every run)."""
    return {
        "model": {"n_layer": 2, "n_embd": 48, "n_head": 4, "block_size": 64},
        "data": {"max_train_bytes": 1_000_000, "max_eval_bytes": 100_000},
        "learners": {"count": 2, "quorum": 1, "batch_size": 16},
        "h": 40,
        "inner": {"lr": 3e-3, "warmup_steps": 20},
        "stop": {"outer_steps": outer_steps},
        "eval_windows": 64,
        # Only this benchmark's scratch clusters: whatever else is registered stays out of it.
        "placement": {"regions": [region]},
        **RUN_TIMINGS[profile],
    }


def run_timings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The timings the run actually ran with (its config over the run-config defaults)."""
    merged = run_config_validate(cfg)
    return {
        "chunk_seconds": merged["chunk_seconds"],
        "learner_timeout": merged["learner_timeout"],
        "syncer_grace_seconds": merged["syncer"]["grace_seconds"],
    }


class Procs:
    def __init__(self, log_dir: Path, health: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.health = health
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        self.running[name] = subprocess.Popen(  # noqa: S603 (our own manage.py)
            [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args],
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.health},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, name: str) -> None:
        proc = self.running.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.running.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.running.clear()


def _wait(predicate: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        close_old_connections()
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _scratch_clusters(tag: str) -> list[Cluster]:
    provider, _ = Provider.objects.get_or_create(
        slug="bench-training", defaults={"display_name": "Training benchmark", "kind": Provider.Kind.OTHER}
    )
    clusters = []
    for i, price in enumerate(PRICES):
        cluster = Cluster.objects.create(
            provider=provider,
            slug=f"bench-{tag}-{i}",
            region=f"bench-{tag}",
            accelerator_type="cpu",
            accelerator_count=1,
            capacity=1,
        )
        price_book_publish(
            unit=Unit.ACCELERATOR_HOUR,
            unit_price=price,
            cluster=cluster,
            effective_from=timezone.now(),
            note="bench",
        )
        clusters.append(cluster)
    return clusters


def _run_figures(run_id: int) -> dict[str, Any]:
    # Chunks still training when the run ended stop within a second or two and then bill;
    # count them (and a failover's recovery) before reading the figures.
    try:
        _wait(
            lambda: (
                not LearnerChunk.objects.filter(
                    learner__run_id=run_id, finished_at__isnull=True, learner__generation=F("generation")
                ).exists()
            ),
            timeout=30,
            what="in-flight chunks",
        )
    except TimeoutError:
        # The figures are still worth reading; say that a chunk's last seconds may be missing.
        print(
            f"run {run_id}: chunks still open after 30 s; figures may miss their last seconds",
            file=sys.stderr,
        )

    run = TrainingRun.objects.get(pk=run_id)
    tokens = TrainingLearner.objects.filter(run=run).aggregate(t=Sum("tokens"))["t"] or 0
    span = 0.0
    for learner in TrainingLearner.objects.filter(run=run):
        # Per generation: a failed-over learner's old and new lives are two spans.
        for gen in range(learner.generation + 1):
            agg = LearnerChunk.objects.filter(
                learner=learner, generation=gen, finished_at__isnull=False
            ).aggregate(a=Min("started_at"), b=Max("finished_at"))
            if agg["a"] and agg["b"]:
                span += (agg["b"] - agg["a"]).total_seconds()
    window = LearnerChunk.objects.filter(learner__run=run, finished_at__isnull=False).aggregate(
        a=Min("started_at"), b=Max("finished_at")
    )
    active = (window["b"] - window["a"]).total_seconds() if window["a"] and window["b"] else 0.0
    merged = GlobalVersionRecord.objects.filter(run=run).aggregate(t=Max("tokens_total"))["t"] or 0
    wall = (run.finished_at - run.started_at).total_seconds() if run.started_at and run.finished_at else 0.0
    return {
        "run_id": run.pk,
        "state": run.state,
        "wall_s": round(wall, 2),
        "tokens_trained": tokens,
        "tokens_merged": merged,
        "learner_span_s": round(span, 2),
        "tokens_per_learner_s": tokens / span if span else 0.0,
        # From the first chunk's start to the last chunk's end: the learners' tokens/s.
        "active_s": round(active, 2),
        "tokens_per_s": tokens / active if active else 0.0,
        "merged_tokens_per_s": merged / wall if wall else 0.0,
        "initial_eval_loss": run.initial_eval_loss,
        "final_eval_loss": run.final_eval_loss,
        "versions": GlobalVersionRecord.objects.filter(run=run).aggregate(v=Max("version"))["v"],
        # Measured by the learners' transports as the blobs crossed the store (headers included):
        # every chunk's sum, per learner index (a failed-over learner's lives together).
        "store_bytes_sent_per_learner": _per_learner(run, "bytes_sent"),
        "store_bytes_received_per_learner": _per_learner(run, "bytes_received"),
    }


def _per_learner(run: TrainingRun, field: str) -> dict[int, int]:
    rows = (
        LearnerChunk.objects.filter(learner__run=run)
        .values("learner__index")
        .annotate(total=Sum(field))
        .order_by("learner__index")
    )
    return {row["learner__index"]: int(row["total"] or 0) for row in rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="manage.py bench training")
    parser.add_argument("--json", required=True, help="where to write the figures")
    parser.add_argument("--outer-steps", type=int, default=45)
    parser.add_argument("--keep", action="store_true", help="leave the scratch clusters as they are")
    parser.add_argument(
        "--ddp-only",
        action="store_true",
        help="only ddp_loss_ratio, fsdp_loss_ratio and resume_loss_ratio (no workers, no runs)",
    )
    parser.add_argument(
        "--fast-health",
        action="store_true",
        help="heartbeat 1 s, down after 6 s, supervisor every 1 s: a quick run, not the shipped timings",
    )
    args = parser.parse_args(argv)
    profile = "fast" if args.fast_health else "shipped"
    health = {"profile": profile, **HEALTH_PROFILES[profile]}
    if args.ddp_only:
        began = time.monotonic()
        cfg = bench_config(outer_steps=args.outer_steps, region="none")
        ddp = ddp_bench(cfg)
        fsdp = ddp_bench(cfg, sharding="fsdp")
        resume = resume_bench(cfg)
        summary = {
            "ddp_loss_ratio": ddp["ddp_loss_ratio"],
            "fsdp_loss_ratio": fsdp["fsdp_loss_ratio"],
            "ddp_group_start_s": ddp["group_start_s"],
            "ddp_group_start_kept_s": ddp["group_start_kept_s"],
            "resume_loss_ratio": resume["resume_loss_ratio"],
            "bench_seconds": round(time.monotonic() - began, 1),
        }
        _write(args.json, {"ddp": ddp, "fsdp": fsdp, "resume": resume, "summary": summary})
        return 0

    # The bench may be pointed at a fresh scratch database: bring its schema up to date first.
    call_command("migrate", verbosity=0)
    log_dir = Path(settings.BASE_DIR) / "var" / "bench-training-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    cfg = bench_config(outer_steps=args.outer_steps, region=f"bench-{tag}", profile=profile)
    clusters = _scratch_clusters(tag)
    procs = Procs(log_dir, HEALTH_PROFILES[profile])
    began = time.monotonic()
    out: dict[str, Any] = {
        "health_timings": health,
        "run_timings": {"profile": profile, **run_timings(cfg)},
        "config": cfg,
        "clusters": [c.slug for c in clusters],
        "logs": str(log_dir),
    }
    try:
        procs.start("control", "worker", "--control", "--loglevel", "warning")
        procs.start("beat", "beat", "--loglevel", "warning")
        for c in clusters:
            procs.start(c.slug, "worker", "--cluster", c.slug, "--loglevel", "warning")
        _wait(
            lambda: Cluster.objects.filter(pk__in=[c.pk for c in clusters], status="healthy").count() == 3,
            timeout=120,
            what="cluster workers",
        )
        print("workers up", flush=True)

        out["bare_before"] = bare_engine_run(cfg, seconds=BARE_SECONDS)
        print("bare engine before", json.dumps(out["bare_before"]), flush=True)
        plain = training_run_create(config=cfg, created_by=None, name="bench-plain")
        _wait(lambda: TrainingRun.objects.get(pk=plain.pk).is_finished, timeout=600, what="the plain run")
        out["plain"] = _run_figures(plain.pk)
        print("plain", json.dumps(out["plain"]), flush=True)
        out["bare_after"] = bare_engine_run(cfg, seconds=BARE_SECONDS)
        print("bare engine after", json.dumps(out["bare_after"]), flush=True)
        plain_wall = out["plain"]["wall_s"]

        failing = training_run_create(config=cfg, created_by=None, name="bench-failure")
        victim = clusters[0]

        def a_third_done() -> bool:
            v = GlobalVersionRecord.objects.filter(run_id=failing.pk).aggregate(v=Max("version"))["v"] or 0
            return v >= args.outer_steps // 3

        _wait(a_third_done, timeout=600, what="a third of the failure run")
        if not TrainingLearner.objects.filter(run_id=failing.pk, cluster=victim).exists():
            raise RuntimeError(f"no learner of the failure run is on {victim.slug}; nothing to kill")
        procs.kill(victim.slug)
        killed_at = timezone.now()
        print(f"killed {victim.slug}", flush=True)
        restart_at = time.monotonic() + plain_wall / 3
        restarted = False
        while not TrainingRun.objects.get(pk=failing.pk).is_finished:
            # Back a third of the plain run later, but never before the failure was detected:
            # with the shipped 30 s down-after, an earlier restart would hide the failure.
            detected = FailoverEvent.objects.filter(
                training_run_id=failing.pk, kind=FailoverEvent.Kind.TRAINING
            ).exists()
            if not restarted and detected and time.monotonic() >= restart_at:
                procs.start(
                    f"{victim.slug}-again", "worker", "--cluster", victim.slug, "--loglevel", "warning"
                )
                restarted = True
                print(f"restarted {victim.slug}", flush=True)
            time.sleep(0.25)
            close_old_connections()
        out["failure"] = _run_figures(failing.pk)
        print("failure", json.dumps(out["failure"]), flush=True)
        events = list(
            FailoverEvent.objects.filter(training_run_id=failing.pk, kind=FailoverEvent.Kind.TRAINING)
        )
        out["ddp"] = ddp_bench(cfg)  # the runs are over: the workers sit idle meanwhile
        print("ddp", json.dumps(out["ddp"]), flush=True)
        out["fsdp"] = ddp_bench(cfg, sharding="fsdp")
        print("fsdp", json.dumps(out["fsdp"]), flush=True)
        out["resume"] = resume_bench(cfg)
        print("resume", json.dumps(out["resume"]), flush=True)
        out["failover_events"] = [
            {
                "subject": e.subject,
                "from": e.from_cluster.slug if e.from_cluster else None,
                "to": e.to_cluster.slug if e.to_cluster else None,
                "reason": e.reason,
                "detected_s": round((e.detected_at - killed_at).total_seconds(), 2),
                "recovered_s": round((e.recovered_at - killed_at).total_seconds(), 2)
                if e.recovered_at
                else None,
                "tokens_lost": e.tokens_lost,
                "extra_cost": str(e.extra_cost),
            }
            for e in events
        ]
    finally:
        procs.stop_all()
        if not args.keep:
            for c in clusters:
                cluster_set_draining(cluster=c, draining=True)

    bare_tokens_per_s = (out["bare_before"]["tokens_per_s"] + out["bare_after"]["tokens_per_s"]) / 2
    first = out["failover_events"][0] if out["failover_events"] else {}
    out["summary"] = {
        "health_timings": health,
        "run_timings": out["run_timings"],
        "orchestration_overhead_ratio": round(out["plain"]["tokens_per_s"] / bare_tokens_per_s, 4),
        "failover_detect_s": first.get("detected_s"),
        "failover_recover_s": first.get("recovered_s"),
        "goodput_with_failure": round(
            out["failure"]["merged_tokens_per_s"] / out["plain"]["merged_tokens_per_s"], 4
        ),
        "loss_ratio_with_failure": round(
            out["failure"]["final_eval_loss"] / out["plain"]["final_eval_loss"], 4
        ),
        "failover_events": len(out["failover_events"]),
        "ddp_loss_ratio": out["ddp"]["ddp_loss_ratio"],
        "fsdp_loss_ratio": out["fsdp"]["fsdp_loss_ratio"],
        "ddp_group_start_s": out["ddp"]["group_start_s"],
        "ddp_group_start_kept_s": out["ddp"]["group_start_kept_s"],
        "resume_loss_ratio": out["resume"]["resume_loss_ratio"],
        "bench_seconds": round(time.monotonic() - began, 1),
    }
    _write(args.json, out)
    return 0


def _write(path: str, out: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(json.dumps(out["summary"], indent=2))
