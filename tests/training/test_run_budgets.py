"""Hard budgets of clusters, providers and teams in training: placement skips a cluster that may
not spend and says why; a running run stops dispatching on an exhausted cluster (its learner moves)
or, for its team's budget or when no cluster is left, stops with the budget named."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from billing.budgets import budget_save
from billing.models import Budget, Unit, UsageRecord
from billing.services import usage_record
from registry.models import Cluster, FailoverEvent
from tests.factories import make_cluster, make_team, tiny_run_config
from training import orchestrator, services
from training.models import LearnerChunk, PlacementDecision, TrainingLearner, TrainingRun


def _cluster(price: str) -> Cluster:
    cluster = make_cluster(price=Decimal(price), accelerator_count=1, capacity=1)
    Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


def _hard_budget(name: str, limit: str, **scope: Any) -> Budget:
    return budget_save(budget=Budget(name=name, limit_amount=Decimal(limit), hard_limit=True, **scope))


def _spend(cluster: Cluster, hours: str, *, team: str = "") -> UsageRecord:
    """Accelerator time billed to the cluster (and team) outside training: the budgets count it."""
    return usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal(hours),
        occurred_at=timezone.now(),
        idempotency_key=f"test:{cluster.slug}:{hours}:{team}",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
        team=team,
    )


def _start(**over: Any) -> TrainingRun:
    run = services.training_run_create(config=tiny_run_config(**over), created_by=None, name="budgets")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    return run


@pytest.mark.django_db
def test_placement_skips_a_cluster_whose_own_or_providers_hard_budget_is_spent(tmp_path: Path) -> None:
    cheapest, cheaper = _cluster("1.0"), _cluster("2.0")
    dear, dearest = _cluster("3.0"), _cluster("4.0")
    _hard_budget("cheapest-cap", "1", scope=Budget.Scope.CLUSTER, cluster=cheapest)
    _hard_budget("cheaper-provider-cap", "1", scope=Budget.Scope.PROVIDER, provider=cheaper.provider)
    _spend(cheapest, "2"), _spend(cheaper, "1")  # 2.00 and 2.00 USD against limits of 1

    run = _start()
    assert run.state == TrainingRun.State.RUNNING
    placed = dict(TrainingLearner.objects.filter(run=run).values_list("index", "cluster_id"))
    assert placed == {0: dear.pk, 1: dearest.pk}
    decision = PlacementDecision.objects.get(run=run, learner_index=0, generation=0)
    rejected = {c["cluster"]: c["rejected"] for c in decision.candidates}
    assert rejected[cheapest.slug].startswith("budget 'cheapest-cap' is spent: 2.00")
    assert rejected[cheaper.slug].startswith("budget 'cheaper-provider-cap' is spent")
    assert rejected[dear.slug] == ""


@pytest.mark.django_db
def test_a_spent_team_budget_leaves_no_cluster_and_the_run_fails_naming_it(tmp_path: Path) -> None:
    a, b = _cluster("1.0"), _cluster("2.0")
    vision, speech = make_team("vision"), make_team("speech")
    _hard_budget("vision-cap", "1", scope=Budget.Scope.TEAM, team="vision")
    _spend(a, "1", team="vision")

    other_team = _start(team="speech")  # another team's runs are not held back
    assert other_team.team == speech
    assert other_team.state == TrainingRun.State.RUNNING
    TrainingRun.objects.filter(pk=other_team.pk).update(state=TrainingRun.State.CANCELLED)
    run = _start(team="vision")
    assert run.team == vision
    assert run.state == TrainingRun.State.FAILED
    assert f"{a.slug}: budget 'vision-cap' is spent" in run.reason
    assert f"{b.slug}: budget 'vision-cap' is spent" in run.reason


@pytest.mark.django_db
def test_a_spent_cluster_budget_stops_new_chunks_there_and_the_learner_moves(tmp_path: Path) -> None:
    a, b = _cluster("36.0"), _cluster("72.0")  # a cent and two cents per second
    spare = _cluster("100.0")
    # Room for less than one 0.5 s chunk on `a`: the first chunk may start, the second may not.
    _hard_budget("a-cap", "0.001", scope=Budget.Scope.CLUSTER, cluster=a)
    run = _start()
    learner = TrainingLearner.objects.get(run=run, index=0)
    assert learner.cluster_id == a.pk
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@a")
    assert UsageRecord.objects.get(subject_id=str(run.pk), cluster=a).amount > Decimal("0.001")

    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=1, worker_hostname="w@a")
    assert not LearnerChunk.objects.filter(learner=learner, seq=1).exists()
    learner.refresh_from_db()
    assert learner.state == "lost" and learner.last_error.startswith(
        f"cluster {a.slug}: budget 'a-cap' is spent"
    )

    services.training_runs_supervise()
    learner.refresh_from_db()
    assert (learner.state, learner.generation, learner.cluster_id) == ("placed", 1, spare.pk)
    event = FailoverEvent.objects.get(training_run_id=run.pk)
    assert event.kind == "training" and event.from_cluster_id == a.pk and event.to_cluster_id == spare.pk
    assert "budget 'a-cap' is spent" in event.reason
    decision = PlacementDecision.objects.get(run=run, learner_index=0, generation=1)
    rejected = {c["cluster"]: c["rejected"] for c in decision.candidates}
    assert rejected[a.slug].startswith("budget 'a-cap' is spent")
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RECOVERING and b.pk in set(
        TrainingLearner.objects.filter(run=run).values_list("cluster_id", flat=True)
    )


@pytest.mark.django_db
def test_a_spent_team_budget_stops_a_running_run_naming_the_budget(tmp_path: Path) -> None:
    _cluster("36.0"), _cluster("72.0")
    vision = make_team("vision")
    _hard_budget("vision-cap", "0.001", scope=Budget.Scope.TEAM, team="vision")
    run = _start(team="vision")
    assert run.team == vision
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    # The chunk is billed to the run's team (its slug), so the team's budget counts it.
    assert UsageRecord.objects.get(subject_id=str(run.pk)).team == run.team_slug == "vision"

    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=1, worker_hostname="w@1")
    run.refresh_from_db()
    assert run.state == TrainingRun.State.BUDGET_EXHAUSTED
    assert run.reason.startswith("budget 'vision-cap' is spent")
    assert not LearnerChunk.objects.filter(learner=learner, seq=1).exists()
    assert run.artifact_uri  # the last published version is kept, as for the run's own budget


@pytest.mark.django_db
def test_a_run_whose_every_cluster_is_over_budget_stops_saying_so(tmp_path: Path) -> None:
    a, b = _cluster("1.0"), _cluster("2.0")
    run = _start()
    _hard_budget("a-cap", "1", scope=Budget.Scope.CLUSTER, cluster=a)
    _hard_budget("b-provider-cap", "1", scope=Budget.Scope.PROVIDER, provider=b.provider)
    _spend(a, "1"), _spend(b, "1")
    for learner in TrainingLearner.objects.filter(run=run):
        orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w")
    assert set(TrainingLearner.objects.filter(run=run).values_list("state", flat=True)) == {"lost"}
    assert not LearnerChunk.objects.filter(learner__run=run).exists()

    services.training_runs_supervise()
    run.refresh_from_db()
    assert run.state == TrainingRun.State.BUDGET_EXHAUSTED
    assert run.reason.startswith("no cluster left within budget: ")
    assert f"{a.slug}: budget 'a-cap' is spent" in run.reason
    assert f"{b.slug}: budget 'b-provider-cap' is spent" in run.reason


@pytest.mark.django_db
def test_a_teams_hard_budget_stops_a_run_inside_its_chunk(tmp_path: Path) -> None:
    """A team budget of 3.00 with 1.00 spent elsewhere, a dollar per accelerator-second and
    60-second chunks: the chunk stops near the 2.00 the budget has left, not 60 later."""
    _cluster("3600.0"), _cluster("3600.0")
    make_team("vision")
    _hard_budget("vision-cap", "3", scope=Budget.Scope.TEAM, team="vision")
    _spend(_cluster("3600.0"), str(Decimal(1) / 3600), team="vision")  # 1.00 USD of other work
    run = _start(team="vision", chunk_seconds=60, learner_timeout=150)
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    chunk = LearnerChunk.objects.get(learner=learner, seq=0)
    assert chunk.stopped_by == services.BUDGET_REACHED and chunk.billed
    run.refresh_from_db()
    assert run.state == TrainingRun.State.BUDGET_EXHAUSTED
    assert "vision-cap" in run.reason or "hard budget" in run.reason
    spent = UsageRecord.objects.filter(subject_type="training_run", subject_id=str(run.pk))
    total = sum(r.amount for r in spent)
    # The budget's 2.00 left, not a 60-second chunk: billed from the claim, the instant the
    # deadline accrues from (a loaded CI machine once billed 1.968 when the bill started after
    # the claim's transaction).
    assert Decimal("1.99") <= total < Decimal("20")
