"""Reads behind the training run pages and API: the list rows, the detail timeline, chart series."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Sum

from billing.money import ledger_text_or_none
from registry.auth.costs import without_money
from registry.auth.teams import filter_by_team
from training.models import LearnerChunk, TrainingLearner, TrainingRun, TrainingRunTransition
from training.selectors import (
    RunProgress,
    run_chunks,
    run_cost_per_cluster,
    run_failover_events,
    run_placements,
    run_progress,
    run_versions,
    training_runs_list,
)


@dataclass(frozen=True)
class RunRow:
    run: TrainingRun
    clusters: list[str]
    progress: RunProgress


def run_rows(*, limit: int = 100, teams: frozenset[int] | None = None) -> list[RunRow]:
    """The runs list: each run with the clusters its learners sit on and its progress; of
    `teams` only (team ids) unless None."""
    runs = list(filter_by_team(training_runs_list(), teams, "team")[:limit])
    clusters: dict[int, set[str]] = {}
    for run_id, slug in TrainingLearner.objects.filter(run__in=runs, cluster__isnull=False).values_list(
        "run_id", "cluster__slug"
    ):
        clusters.setdefault(run_id, set()).add(slug)
    return [
        RunRow(run=r, clusters=sorted(clusters.get(r.pk, set())), progress=run_progress(run=r)) for r in runs
    ]


def run_learners(*, run: TrainingRun) -> list[TrainingLearner]:
    return list(TrainingLearner.objects.filter(run=run).select_related("cluster").order_by("index"))


def run_transitions(*, run: TrainingRun) -> list[TrainingRunTransition]:
    return list(TrainingRunTransition.objects.filter(run=run).order_by("at", "id"))


def run_timeline(*, run: TrainingRun, costs: bool = True) -> list[dict[str, Any]]:
    """State transitions, placement decisions and failover events, oldest first; without prices
    and extra costs when `costs` is false (registry.auth.roles.can_see_costs)."""
    events: list[dict[str, Any]] = []
    for t in run_transitions(run=run):
        events.append({"at": t.at, "kind": "state", "text": f"{t.from_state or '—'} → {t.to_state}",
                       "detail": t.reason})  # fmt: skip
    for p in run_placements(run=run):
        price = f"{p.unit_price} {p.currency}/accelerator-hour" if p.unit_price is not None else "no price"
        if not costs:
            price = ""
        events.append({"at": p.decided_at, "kind": "placement",
                       "text": f"learner {p.learner_index} g{p.generation} → {p.cluster.slug} ({p.reason})",
                       "detail": price})  # fmt: skip
    for f in run_failover_events(run=run):
        src = f.from_cluster.slug if f.from_cluster else "?"
        dst = f.to_cluster.slug if f.to_cluster else "?"
        detail = f.reason
        if f.tokens_lost is not None:
            detail += f"; {f.tokens_lost} tokens lost"
        events.append({"at": f.detected_at, "kind": "failover", "text": f"{f.subject}: {src} → {dst}",
                       "detail": detail})  # fmt: skip
        if f.recovered_at is not None:
            events.append({"at": f.recovered_at, "kind": "recovered", "text": f"{f.subject} recovered",
                           "detail": f"extra cost {f.extra_cost} {f.currency}" if costs else ""})  # fmt: skip
    events.sort(key=lambda e: e["at"])
    return events


def run_cost_summary(*, run: TrainingRun) -> dict[str, Any]:
    """Ledger cost so far and what it bought; Decimals are left to the caller to format."""
    progress = run_progress(run=run)
    return {
        "cost": progress.cost,
        "currency": progress.currency,
        "cost_per_million_tokens": progress.cost_per_million_tokens,
        "cost_per_loss_improvement": progress.cost_per_loss_improvement,
        "per_cluster": run_cost_per_cluster(run=run),
    }


def run_metric_series(*, run: TrainingRun) -> dict[str, Any]:
    """Chart series: versions (eval loss vs tokens / wall time / money), per-learner train loss,
    bytes per sync and learners merged per version. Money stays Decimal here."""
    versions = []
    for v in run_versions(run=run):
        versions.append({
            "fragment": v.fragment,
            "version": v.version,
            "published_at": v.published_at,
            "eval_loss": v.eval_loss,
            "tokens_total": v.tokens_total,
            "tokens_merged": v.tokens_merged,
            "wall_seconds": v.wall_seconds,
            "cost_so_far": v.cost_so_far,
            "bytes_in": v.bytes_in,
            "learners_merged": list(v.learners_merged),
        })  # fmt: skip
    # Train loss per learner: chunks in (generation, seq) order, steps counted across chunks.
    train_loss: dict[int, dict[str, list[float]]] = {}
    chunks = run_chunks(run=run).order_by("learner__index", "generation", "seq")
    steps_so_far: dict[int, int] = {}
    for c in chunks:
        idx = c.learner.index
        series = train_loss.setdefault(idx, {"step": [], "loss": []})
        base = steps_so_far.get(idx, 0)
        losses = [float(x) for x in (c.train_losses or []) if isinstance(x, (int, float))]
        for i, loss in enumerate(losses):
            series["step"].append(base + i + 1)
            series["loss"].append(loss)
        steps_so_far[idx] = base + max(c.steps, len(losses))
    bytes_sent = run_chunks(run=run).aggregate(b=Sum("bytes_sent"))["b"] or 0
    return {
        "versions": versions,
        "train_loss": {str(k): v for k, v in sorted(train_loss.items())},
        "bytes_sent": int(bytes_sent),
        "started_at": run.started_at,
    }


def run_metrics_payload(*, run: TrainingRun, costs: bool = True) -> dict[str, Any]:
    """The chart series as JSON-safe values (money as strings; none when `costs` is false)."""
    series = run_metric_series(run=run)
    payload = {
        "state": run.state,
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "bytes_sent": series["bytes_sent"],
        "versions": [
            {
                **v,
                "published_at": v["published_at"].isoformat(),
                "cost_so_far": ledger_text_or_none(v["cost_so_far"]),
            }
            for v in series["versions"]
        ],
        "train_loss": series["train_loss"],
        "events": [{**e, "at": e["at"].isoformat()} for e in run_timeline(run=run, costs=costs)],
    }
    return payload if costs else without_money(payload)


@dataclass(frozen=True)
class RankStarts:
    """How a multi-rank run's chunks got their other ranks: started for the chunk, or the group
    its worker kept from the learner's previous chunk (training.engine.distributed)."""

    started: int
    started_seconds: float
    kept: int
    kept_seconds: float


def run_rank_starts(*, run: TrainingRun) -> RankStarts | None:
    """Counts and summed seconds of each kind of rank start; None for a run of one-rank learners."""
    rows = {
        kind: (count, seconds or 0.0)
        for kind, count, seconds in run_chunks(run=run)
        .exclude(ranks_start="")
        .values("ranks_start")
        .annotate(n=Count("id"), s=Sum("ranks_start_seconds"))
        .values_list("ranks_start", "n", "s")
    }
    if not rows:
        return None
    started = rows.get(LearnerChunk.RankStart.STARTED, (0, 0.0))
    kept = rows.get(LearnerChunk.RankStart.KEPT, (0, 0.0))
    return RankStarts(started=started[0], started_seconds=started[1], kept=kept[0], kept_seconds=kept[1])
