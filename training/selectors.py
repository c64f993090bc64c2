"""Reads for training: probe jobs, training runs, their learners, versions and cost."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TypedDict

from django.conf import settings
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, Sum

from billing.budgets import budget_hard_limit_keys, budget_headroom, budget_may_spend, spend_target
from billing.models import Unit
from billing.selectors import PriceResolver, spend_grouped, spend_total, usage_for_subject
from billing.services import SECONDS_PER_HOUR
from registry.models import Cluster, FailoverEvent, WorkerHeartbeat
from registry.store.cluster_stores import store_identity
from registry.validation import id_parse
from training.models import (
    GlobalVersionRecord,
    LearnerChunk,
    ModelVersion,
    PlacementDecision,
    ProbeJob,
    TrainingLearner,
    TrainingRun,
)
from training.placement import CheckpointAt, ClusterOption

RUN_SUBJECT_TYPE = "training_run"


def probe_jobs_recent(*, limit: int = 20) -> QuerySet[ProbeJob]:
    return ProbeJob.objects.select_related("cluster", "created_by").order_by("-created_at")[:limit]


def training_runs_list() -> QuerySet[TrainingRun]:
    return TrainingRun.objects.select_related("created_by", "registered_model").order_by("-created_at")


def training_run_exists(subject_id: str) -> bool:
    """Whether a run has this id (text, as the ledger and budgets hold it)."""
    run_id = id_parse(subject_id)
    return run_id is not None and TrainingRun.objects.filter(pk=run_id).exists()


def training_run_key_team(rest: str) -> int | None:
    """The team that owns the object-store keys `runs/<id>/...` (`rest` is the key after
    `runs/`): the run's; None (the platform's) for a platform run or one that does not exist."""
    head = rest.partition("/")[0]
    run_id = id_parse(head)
    if run_id is None or str(run_id) != head:  # "01" or "+1" is not run 1's folder
        return None
    return TrainingRun.objects.filter(pk=run_id).values_list("team_id", flat=True).first()


def training_runs_of_teams(teams: frozenset[int]) -> QuerySet[TrainingRun]:
    """The runs these teams own (for budgets and failover events, which name runs by id)."""
    return TrainingRun.objects.filter(team__in=teams)


def training_runs_live() -> QuerySet[TrainingRun]:
    return TrainingRun.objects.filter(state__in=[TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING])


def learner_failover_subject(*, run_id: int, index: int) -> str:
    return f"training-run:{run_id}/learner:{index}"


def learner_open_failover(*, learner: TrainingLearner) -> FailoverEvent | None:
    return (
        FailoverEvent.objects.filter(
            kind=FailoverEvent.Kind.TRAINING,
            training_run_id=learner.run_id,
            subject=learner_failover_subject(run_id=learner.run_id, index=learner.index),
            recovered_at__isnull=True,
        )
        .order_by("-detected_at")
        .first()
    )


def run_failover_events(*, run: TrainingRun) -> QuerySet[FailoverEvent]:
    return FailoverEvent.objects.filter(
        kind=FailoverEvent.Kind.TRAINING, training_run_id=run.pk
    ).select_related("from_cluster", "to_cluster")


def run_spend(*, run_id: int) -> Decimal:
    """Cost so far: the ledger's total for the run (every chunk is billed as it finishes)."""
    return spend_total(subject_type=RUN_SUBJECT_TYPE, subject_id=str(run_id))


# Heartbeats a worker may miss before its chunk stops counting towards the run's rate of spend.
_MISSED_HEARTBEATS = 3


def chunk_price_per_second(
    chunk: LearnerChunk, *, at: datetime, prices: PriceResolver | None = None
) -> Decimal | None:
    """What the chunk costs per second held (its cluster's accelerator-hour price in force ×
    its accelerators / 3600); None when no price is in force (it will not be billed)."""
    price = (prices or PriceResolver()).resolve(
        unit=Unit.ACCELERATOR_HOUR, at=at, cluster_id=chunk.cluster_id, provider_id=chunk.cluster.provider_id
    )
    return price.unit_price * chunk.accelerators / SECONDS_PER_HOUR if price is not None else None


def run_budget_left(*, run: TrainingRun, now: datetime) -> tuple[Decimal, Decimal] | None:
    """(what the tightest budget of the run still allows, what the run spends per second now);
    None without a money budget or a hard budget of the run or its team.

    Spent: the ledger's total for the run (a chunk is billed as it finishes) plus what each
    unfinished chunk has run up since its claim at its price (chunk_price_per_second): up to
    now, or for a chunk whose worker stopped heartbeating up to its last heartbeat (as
    supervision bills a lost chunk); the rate is the sum of the live chunks' prices."""
    headroom = budget_headroom(target=spend_target(team=run.team_slug, training_run_id=str(run.pk)))
    if run.money_budget is None and headroom is None:
        return None
    chunks = LearnerChunk.objects.filter(learner__run=run, finished_at__isnull=True).select_related("cluster")
    stale = timedelta(seconds=settings.HEARTBEAT_SECONDS * _MISSED_HEARTBEATS)
    prices = PriceResolver()
    accrued = rate = Decimal(0)
    for chunk in chunks:
        per_second = chunk_price_per_second(chunk, at=now, prices=prices)
        if per_second is None:
            continue
        seen = (
            WorkerHeartbeat.objects.filter(cluster_id=chunk.cluster_id, hostname=chunk.worker_hostname)
            .values_list("last_seen_at", flat=True)
            .first()
        )
        live = seen is None or now - seen <= stale  # no heartbeat row: a worker of this process
        end = now if live or seen is None else max(seen, chunk.progress_at or chunk.started_at)
        accrued += per_second * Decimal(str(max(0.0, (end - chunk.started_at).total_seconds())))
        if live:
            rate += per_second
    # A hard budget's spent amount already holds the run's billed chunks; its own does not.
    left = [room - accrued for room in (headroom,) if room is not None]
    if run.money_budget is not None:
        left.append(run.money_budget - run_spend(run_id=run.pk) - accrued)
    return min(left), rate


def run_budget_deadline(*, run: TrainingRun, now: datetime) -> datetime | None:
    """When the run's money budget, or a hard budget of the run or its team, will be spent at the
    rate the run spends now (run_budget_left); `now` when it is spent already; None without
    such a budget or with nothing running. A chunk checks it at every inner step
    (training.orchestrator), so a run stops within about one step (and its checkpoint write) of
    its budget instead of at the end of a chunk."""
    position = run_budget_left(run=run, now=now)
    if position is None:
        return None
    remaining, rate = position
    if remaining <= 0:
        return now
    if rate == 0:
        return None
    return now + timedelta(seconds=float(remaining / rate))


def learners_occupying(*, exclude_run_id: int | None = None) -> dict[int, int]:
    """Learner slots taken per cluster id by live runs (placed or running learners)."""
    rows = TrainingLearner.objects.filter(
        state__in=[TrainingLearner.State.PLACED, TrainingLearner.State.RUNNING],
        run__state__in=TrainingRun.LIVE_STATES,
        cluster__isnull=False,
    )
    if exclude_run_id is not None:
        rows = rows.exclude(run_id=exclude_run_id)
    return dict(rows.values_list("cluster_id").annotate(n=Count("id")).values_list("cluster_id", "n"))


def run_budget_refusal(*, run: TrainingRun) -> str:
    """Why a hard budget of the run's team or of the run itself forbids more spend ("" when none
    does): such a budget stops the run wherever its learners are."""
    ok, why = budget_may_spend(target=spend_target(team=run.team_slug, training_run_id=str(run.pk)))
    return "" if ok else why


def cluster_budget_refusal(
    *,
    cluster: Cluster,
    team: str = "",
    training_run_id: str = "",
    hard_keys: frozenset[tuple[str, str]] | None = None,
) -> str:
    """Why a hard budget forbids spending on this cluster ("" when none does): the cluster's, its
    provider's, and (when given) the team's and the run's, each for its current period.

    `hard_keys` (budget_hard_limit_keys()) lets a caller checking many clusters skip those that no
    hard budget covers without reading any budget state."""
    target = spend_target(cluster=cluster, team=team, training_run_id=training_run_id)
    if hard_keys is not None and not hard_keys.intersection(target.keys()):
        return ""
    ok, why = budget_may_spend(target=target)
    return "" if ok else why


def cluster_options(
    *, at: datetime, exclude_run_id: int | None = None, team: str = "", training_run_id: str = ""
) -> list[ClusterOption]:
    """Every registered cluster as placement sees it: status, price in force, free learner slots,
    and the hard budget (the cluster's, its provider's, the team's, the run's) that is spent."""
    taken = learners_occupying(exclude_run_id=exclude_run_id)
    prices = PriceResolver()
    hard_keys = budget_hard_limit_keys()
    out = []
    for cluster in Cluster.objects.select_related("provider").order_by("slug"):
        price = prices.resolve(
            unit=Unit.ACCELERATOR_HOUR, at=at, cluster_id=cluster.pk, provider_id=cluster.provider_id
        )
        blocked = cluster_budget_refusal(
            cluster=cluster, team=team, training_run_id=training_run_id, hard_keys=hard_keys
        )
        out.append(
            ClusterOption(
                cluster_id=cluster.pk,
                slug=cluster.slug,
                status=cluster.status,
                accelerator_type=cluster.accelerator_type,
                region=cluster.region or cluster.provider.region,
                free=max(0, cluster.capacity - taken.get(cluster.pk, 0)),
                price=price.unit_price if price is not None else None,
                price_book_id=price.pk if price is not None else None,
                currency=price.currency if price is not None else "USD",
                budget_refusal=blocked,
                devices=accelerators_per_learner(cluster),
                store=store_identity(cluster),
            )
        )
    return out


def learner_checkpoint_at(*, run: TrainingRun, index: int, at: datetime) -> CheckpointAt | None:
    """Where learner `index`'s newest checkpoint lies (the last chunk that wrote one: its
    cluster's store, its size) and that cluster's egress price, for placement's rule 4."""
    chunk = (
        LearnerChunk.objects.filter(learner__run=run, learner__index=index, checkpoint_bytes__gt=0)
        .select_related("cluster")
        .order_by("-generation", "-seq")
        .first()
    )
    if chunk is None:
        return None
    store = store_identity(chunk.cluster)
    price = None
    if store:
        found = PriceResolver().resolve(
            unit=Unit.EGRESS_GB, at=at, cluster_id=chunk.cluster_id, provider_id=chunk.cluster.provider_id
        )
        price = found.unit_price if found is not None else None
    return CheckpointAt(
        store=store,
        nbytes=chunk.checkpoint_bytes,
        egress_price=price,
        cluster=chunk.cluster.slug if store else "",
    )


def accelerators_per_learner(cluster: Cluster) -> int:
    """A learner holds one slot: the cluster's accelerators divided by its learner capacity."""
    return max(1, cluster.accelerator_count // max(1, cluster.capacity))


@dataclass(frozen=True)
class RunProgress:
    state: str
    versions: int  # newest version of the least advanced fragment
    tokens: int  # tokens trained by all learners
    tokens_merged: int
    eval_loss: float | None
    cost: Decimal
    currency: str
    initial_eval_loss: float | None = None

    @property
    def cost_per_million_tokens(self) -> Decimal | None:
        """Ledger cost so far per 1M tokens the learners trained."""
        if not self.tokens:
            return None
        return (self.cost * Decimal(1_000_000) / Decimal(self.tokens)).quantize(Decimal("0.000001"))

    @property
    def cost_per_loss_improvement(self) -> Decimal | None:
        """Ledger cost so far per nat/byte of eval-loss improvement since version 0."""
        if self.eval_loss is None or self.initial_eval_loss is None:
            return None
        gained = self.initial_eval_loss - self.eval_loss
        if gained <= 0:
            return None
        return (self.cost / Decimal(str(round(gained, 6)))).quantize(Decimal("0.000001"))


def run_progress(*, run: TrainingRun) -> RunProgress:
    latest = GlobalVersionRecord.objects.filter(run=run).order_by("-published_at", "-id").first()
    # The newest version the evaluator has scored (it runs behind the syncer, on a cluster).
    scored = (
        GlobalVersionRecord.objects.filter(run=run, eval_loss__isnull=False)
        .order_by("-published_at", "-id")
        .values_list("eval_loss", flat=True)
        .first()
    )
    per_fragment = GlobalVersionRecord.objects.filter(run=run).values("fragment").annotate(v=Count("id"))
    versions = min((r["v"] - 1 for r in per_fragment), default=0)
    tokens = TrainingLearner.objects.filter(run=run).aggregate(t=Sum("tokens"))["t"] or 0
    return RunProgress(
        state=run.state,
        versions=versions,
        tokens=int(tokens),
        tokens_merged=latest.tokens_total if latest is not None else 0,
        eval_loss=run.final_eval_loss if run.final_eval_loss is not None else scored,
        cost=run_spend(run_id=run.pk),
        currency=run.currency,
        initial_eval_loss=run.initial_eval_loss,
    )


def run_versions(*, run: TrainingRun) -> QuerySet[GlobalVersionRecord]:
    return GlobalVersionRecord.objects.filter(run=run).order_by("published_at", "fragment", "version")


def model_version_lookup(ref: object) -> ModelVersion | None:
    """The model version a config or a form names: ``"<model slug>@<number>"`` or its id."""
    versions = ModelVersion.objects.select_related("registered_model", "run")
    if isinstance(ref, str) and "@" in ref:
        slug, _, number = ref.rpartition("@")
        n = id_parse(number)
        if not slug or n is None:
            return None
        return versions.filter(registered_model__slug=slug, number=n).first()
    pk = id_parse(ref)
    return versions.filter(pk=pk).first() if pk is not None else None


def run_model_versions(*, run: TrainingRun) -> QuerySet[ModelVersion]:
    """The versions a run registered, oldest first (the run page and the API)."""
    return ModelVersion.objects.filter(run=run).select_related("registered_model").order_by("number")


def run_placements(*, run: TrainingRun) -> QuerySet[PlacementDecision]:
    return PlacementDecision.objects.filter(run=run).select_related("cluster").order_by("decided_at", "id")


def run_chunks(*, run: TrainingRun) -> QuerySet[LearnerChunk]:
    return LearnerChunk.objects.filter(learner__run=run).select_related("learner", "cluster")


class ClusterCost(TypedDict):
    cluster: str
    unit: str  # billing Unit: accelerator_hour (compute) or egress_gb (data that left the cluster)
    amount: Decimal
    quantity: Decimal


def run_cost_per_cluster(*, run: TrainingRun) -> list[ClusterCost]:
    """Ledger spend of the run per cluster and unit: [{cluster, unit, amount, quantity}], so
    that data movement (egress_gb) shows beside compute (accelerator_hour)."""
    rows = (
        usage_for_subject(subject_type=RUN_SUBJECT_TYPE, subject_id=str(run.pk))
        .values("cluster__slug", "unit")
        .annotate(amount=Sum("amount"), quantity=Sum("quantity"))
        .order_by("cluster__slug", "unit")
    )
    return [
        ClusterCost(cluster=r["cluster__slug"], unit=r["unit"], amount=r["amount"], quantity=r["quantity"])
        for r in rows
    ]


def learner_inflight_chunk(*, learner: TrainingLearner) -> LearnerChunk | None:
    return (
        LearnerChunk.objects.filter(learner=learner, generation=learner.generation, finished_at__isnull=True)
        .order_by("-seq")
        .first()
    )


def run_has_open_failovers(*, run: TrainingRun) -> bool:
    return (
        run_failover_events(run=run).filter(recovered_at__isnull=True).exists()
        or TrainingLearner.objects.filter(Q(run=run) & Q(state=TrainingLearner.State.LOST)).exists()
    )


@dataclass(frozen=True)
class RunMetrics:
    """A run's figures for /metrics (stack.metrics)."""

    run_id: int
    name: str
    state: str
    tokens: int
    eval_loss: float | None
    cost: Decimal
    currency: str


def runs_for_metrics(*, finished_since: datetime) -> list[RunMetrics]:
    """Runs that are not finished, and those finished since `finished_since` (their last figures
    stay scrapeable a while): tokens trained (all learners), the newest eval loss of the global
    parameters, and the cost from the ledger's daily rollups (plus the small unfolded tail)."""
    finished = [
        TrainingRun.State.SUCCEEDED,
        TrainingRun.State.FAILED,
        TrainingRun.State.CANCELLED,
        TrainingRun.State.BUDGET_EXHAUSTED,
    ]
    tokens = (
        TrainingLearner.objects.filter(run=OuterRef("pk"))
        .values("run")
        .annotate(total=Sum("tokens"))
        .values("total")
    )
    loss = (
        GlobalVersionRecord.objects.filter(run=OuterRef("pk"), eval_loss__isnull=False)
        .order_by("-published_at", "-id")
        .values("eval_loss")[:1]
    )
    runs = list(
        TrainingRun.objects.filter(~Q(state__in=finished) | Q(finished_at__gte=finished_since))
        .annotate(tokens_total=Subquery(tokens), latest_loss=Subquery(loss))
        .order_by("pk")
    )
    if not runs:
        return []
    first_day = min((r.started_at or r.created_at) for r in runs).date()
    spend = spend_grouped(by=("training_run_id", "currency"), since_day=first_day)
    out = []
    for run in runs:
        cost = spend.get((str(run.pk), run.currency), Decimal(0))
        # Before the first merge the global parameters are the initial ones (version 0).
        eval_loss = next(
            (x for x in (run.final_eval_loss, run.latest_loss, run.initial_eval_loss) if x is not None), None
        )
        out.append(
            RunMetrics(run.pk, run.name, run.state, int(run.tokens_total or 0), eval_loss, cost, run.currency)
        )
    return out
