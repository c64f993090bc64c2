"""Spot interruption notices: the API checks its input and roles; a learner on the interrupted
cluster pushes its delta at the next step boundary and stops, the supervisor re-places it, and the
failover loses no tokens (the re-placed learner continues from the interrupted chunk's checkpoint)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from registry.models import Cluster, FailoverEvent
from tests.factories import api_client, make_cluster, tiny_run_config
from training import orchestrator, services
from training.models import LearnerChunk, PlacementDecision, TrainingLearner, TrainingRun
from training.run_engines import run_transport


def _cluster(price: str, *, spot: bool = False) -> Cluster:
    cluster = make_cluster(
        price=Decimal(price),
        accelerator_count=1,
        capacity=1,
        capacity_type=Cluster.CapacityType.SPOT if spot else Cluster.CapacityType.ON_DEMAND,
    )
    Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


def _notice(user: User, slug: str, body: dict[str, Any] | None = None) -> Any:
    return api_client(user).post(f"/api/clusters/{slug}/interruption/", body or {}, format="json")


@pytest.mark.django_db
def test_the_interruption_api_checks_role_cluster_and_deadline(
    viewer: User, operator: User, admin_user: User
) -> None:
    spot, on_demand = _cluster("1.0", spot=True), _cluster("1.0")
    assert _notice(viewer, spot.slug).status_code == 403
    assert _notice(operator, "no-such-cluster").status_code == 404

    response = _notice(operator, on_demand.slug)
    assert response.status_code == 400
    assert "only a spot cluster is interrupted" in response.json()["cluster"][0]
    past = (timezone.now() - timedelta(seconds=5)).isoformat()
    response = _notice(operator, spot.slug, {"deadline": past})
    assert response.status_code == 400 and "has passed" in response.json()["deadline"][0]
    response = _notice(operator, spot.slug, {"deadline": "tomorrow at noon"})
    assert response.status_code == 400 and response.json()["deadline"]
    far = (timezone.now() + timedelta(hours=2)).isoformat()
    response = _notice(operator, spot.slug, {"deadline": far})
    assert response.status_code == 400 and "at most 60 minutes" in response.json()["deadline"][0]
    spot.refresh_from_db()
    assert spot.status == "healthy" and spot.interruption_noticed_at is None

    response = _notice(operator, spot.slug)  # no deadline: the usual two minutes
    assert response.status_code == 200, response.content
    spot.refresh_from_db()
    assert spot.status == "draining" and spot.interrupted
    assert spot.interruption_deadline is not None and spot.interruption_noticed_at is not None
    assert spot.interruption_deadline - spot.interruption_noticed_at == timedelta(seconds=120)
    assert response.json()["interruption_deadline"] is not None
    # A later notice never pushes the deadline back; an admin may send one too.
    later = (timezone.now() + timedelta(minutes=30)).isoformat()
    assert _notice(admin_user, spot.slug, {"deadline": later}).status_code == 200
    first_deadline = spot.interruption_deadline
    spot.refresh_from_db()
    assert spot.interruption_deadline == first_deadline

    # Resuming the cluster (the capacity came back) ends the notice.
    assert api_client(operator).post(f"/api/clusters/{spot.slug}/resume/").status_code == 200
    spot.refresh_from_db()
    assert not spot.interrupted and spot.interruption_deadline is None


@pytest.mark.django_db
def test_an_interrupted_learner_pushes_its_delta_stops_and_is_re_placed_losing_no_tokens(
    tmp_path: Path, operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    spot, other = _cluster("1.0", spot=True), _cluster("2.0")
    spare = _cluster("4.0")
    # h is longer than the chunk: nothing is pushed unless the interruption pushes it.
    run = services.training_run_create(
        config=tiny_run_config(h=10_000, chunk_seconds=3.0), created_by=None, name="spot"
    )
    services.training_run_place(run_id=run.pk)
    learner = TrainingLearner.objects.get(run=run, index=0)
    assert learner.cluster_id == spot.pk

    # The notice arrives while the chunk trains: at its first look at the database.
    real_should_stop = services.learner_chunk_should_stop
    sent: list[int] = []

    def notice_then_check(*, learner_id: int, generation: int) -> str:
        if not sent:
            sent.append(_notice(operator, spot.slug).status_code)
        return real_should_stop(learner_id=learner_id, generation=generation)

    monkeypatch.setattr(services, "learner_chunk_should_stop", notice_then_check)
    monkeypatch.setattr(orchestrator, "CHECK_SECONDS", 0.2)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@spot")
    assert sent == [200]

    chunk = LearnerChunk.objects.get(learner=learner, generation=0, seq=0)
    assert chunk.stopped_by.startswith(f"interrupted: cluster {spot.slug} is reclaimed at ")
    assert chunk.error == "" and chunk.finished_at is not None and chunk.billed
    assert chunk.tokens > 0 and chunk.deltas_pushed == 1
    # The delta carries every token the chunk trained.
    transport = run_transport(run)
    (delta_id,) = transport.delta_ids(0, learner=0)
    assert transport.get_delta(0, delta_id).tokens == chunk.tokens
    learner.refresh_from_db()
    assert learner.state == "lost" and learner.tokens_at_last_push == learner.tokens == chunk.tokens

    services.training_runs_supervise()
    learner.refresh_from_db()
    assert (learner.state, learner.generation, learner.cluster_id) == ("placed", 1, spare.pk)
    decision = PlacementDecision.objects.get(run=run, learner_index=0, generation=1)
    rejected = {c["cluster"]: c["rejected"] for c in decision.candidates}
    assert decision.reason == "failover" and rejected[spot.slug] == "status draining"
    event = FailoverEvent.objects.get(training_run_id=run.pk)
    assert event.kind == "training" and "interrupted: cluster" in event.reason
    assert event.code == "preemption"
    assert (event.from_cluster_id, event.to_cluster_id) == (spot.pk, spare.pk)
    assert event.tokens_lost == 0 and event.extra_cost == 0
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RECOVERING

    # The re-placed learner continues from the interrupted chunk's checkpoint; its first steps
    # close the failover.
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=1, seq=0, worker_hostname="w@spare")
    moved = LearnerChunk.objects.get(learner=learner, generation=1, seq=0)
    assert moved.state_source == "checkpoint" and moved.stopped_by == "" and moved.steps > 0
    event.refresh_from_db()
    assert event.recovered_at is not None
    assert other.pk in set(TrainingLearner.objects.filter(run=run).values_list("cluster_id", flat=True))


@pytest.mark.django_db
def test_a_learner_whose_chunk_has_not_started_leaves_the_interrupted_cluster_at_once(
    tmp_path: Path, operator: User
) -> None:
    spot, _ = _cluster("1.0", spot=True), _cluster("2.0")
    spare = _cluster("4.0")
    run = services.training_run_create(config=tiny_run_config(), created_by=None, name="spot")
    services.training_run_place(run_id=run.pk)
    learner = TrainingLearner.objects.get(run=run, index=0)
    assert _notice(operator, spot.slug).status_code == 200

    # Its queued chunk starts nothing on the reclaimed cluster.
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@spot")
    assert not LearnerChunk.objects.filter(learner=learner).exists()
    services.training_runs_supervise()
    learner.refresh_from_db()
    assert (learner.state, learner.generation, learner.cluster_id) == ("placed", 1, spare.pk)
    event = FailoverEvent.objects.get(training_run_id=run.pk)
    assert "(spot interruption notice)" in event.reason and event.tokens_lost == 0
    assert event.code == "preemption"
