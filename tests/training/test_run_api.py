"""Training run API: launch validation, roles, cancel, and the detail / metrics figures taken from
fabricated versions, chunks and ledger rows written through billing.services.usage_record."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from registry.failover_codes import FailoverCode
from registry.models import FailoverEvent
from registry.services import failover_event_record
from tests.factories import api_client, fabricate_run
from training.models import (
    TrainingRun,
)

S = TrainingRun.State


@pytest.mark.django_db
def test_an_invalid_config_answers_400_with_field_messages_and_creates_nothing(
    operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api_client(operator).post(
            "/api/training-runs/",
            {"name": "bad", "config": {"learners": {"count": 2, "quorum": 5}, "stop": {"outer_steps": 3}}},
            format="json",
        )
    assert response.status_code == 400, response.content
    assert response.json()["learners.quorum"] == ["must be between 1 and learners.count (2)"]
    assert not TrainingRun.objects.exists()
    assert callbacks == []


@pytest.mark.django_db
def test_an_operator_launches_a_run_and_its_placement_is_dispatched_after_commit(
    operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api_client(operator).post(
            "/api/training-runs/", {"name": "good", "config": {"stop": {"outer_steps": 3}}}, format="json"
        )
    assert response.status_code == 201, response.content
    run = TrainingRun.objects.get()
    assert response.json()["id"] == run.pk and run.state == S.PENDING and run.created_by == operator
    assert len(callbacks) == 1


@pytest.mark.django_db
def test_a_viewer_reads_runs_but_cannot_launch_or_cancel(viewer: User) -> None:
    run = fabricate_run()
    client = api_client(viewer)
    assert client.get("/api/training-runs/").json()["results"][0]["id"] == run.pk
    response = client.post(
        "/api/training-runs/", {"name": "x", "config": {"stop": {"outer_steps": 3}}}, format="json"
    )
    assert response.status_code == 403
    assert client.post(f"/api/training-runs/{run.pk}/cancel/", {}, format="json").status_code == 403
    assert TrainingRun.objects.count() == 1
    run.refresh_from_db()
    assert run.state == S.RUNNING


@pytest.mark.django_db
def test_detail_gives_transitions_learners_placements_and_ledger_cost_to_the_cent(auditor: User) -> None:
    run = fabricate_run()
    failover_event_record(
        kind=FailoverEvent.Kind.TRAINING,
        code=FailoverCode.HEARTBEAT_TIMEOUT,
        subject=f"training-run:{run.pk}/learner:1",
        reason="cluster down",
        detected_at=timezone.now(),
        training_run_id=run.pk,
        tokens_lost=42,
    )
    body = api_client(auditor).get(f"/api/training-runs/{run.pk}/").json()
    assert body["state"] == "running"
    assert [(t["from"], t["to"]) for t in body["transitions"]] == [
        ("pending", "placing"),
        ("placing", "running"),
    ]
    assert [(lr["index"], lr["tokens"]) for lr in body["learners"]] == [(0, 1000), (1, 3000)]
    assert [p["unit_price"] for p in body["placements"]] == ["2.000000000", "3.000000000"]
    progress = body["progress"]
    assert progress["cost"] == "4.500000000"
    assert isinstance(progress["cost"], str)
    # 4.50 USD over 4,000 tokens; 4.50 USD over 5.0 - 3.0 of eval loss.
    assert Decimal(progress["cost_per_million_tokens"]) == Decimal("1125.00")
    assert Decimal(progress["cost_per_loss_improvement"]) == Decimal("2.25")
    per_cluster = {r["cluster"]: Decimal(r["amount"]) for r in body["cost_per_cluster"]}
    assert sorted(per_cluster.values()) == [Decimal("1.50"), Decimal("3.00")]
    assert [(f["tokens_lost"], f["subject"]) for f in body["failover_events"]] == [
        (42, f"training-run:{run.pk}/learner:1")
    ]


@pytest.mark.django_db
def test_metrics_give_the_chart_series(auditor: User) -> None:
    run = fabricate_run()
    body = api_client(auditor).get(f"/api/training-runs/{run.pk}/metrics/").json()
    assert [v["eval_loss"] for v in body["versions"]] == [5.0, 4.0, 3.0]
    assert [v["tokens_total"] for v in body["versions"]] == [0, 1000, 2000]
    assert all(isinstance(v["cost_so_far"], str) for v in body["versions"])
    assert [Decimal(v["cost_so_far"]) for v in body["versions"]] == [
        Decimal("0"),
        Decimal("1.5"),
        Decimal("4.5"),
    ]
    assert [len(v["learners_merged"]) for v in body["versions"]] == [0, 2, 2]
    assert body["train_loss"] == {"0": {"step": [1, 2, 3], "loss": [5.5, 5.0, 4.5]},
                                  "1": {"step": [1, 2, 3], "loss": [5.5, 4.0, 3.5]}}  # fmt: skip
    assert body["bytes_sent"] == 300
    assert [e["kind"] for e in body["events"]].count("placement") == 2


@pytest.mark.django_db
def test_an_operator_cancels_a_live_run_once(operator: User) -> None:
    run = fabricate_run()
    client = api_client(operator)
    response = client.post(f"/api/training-runs/{run.pk}/cancel/", {"reason": "enough"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "cancelled"
    run.refresh_from_db()
    assert run.state == S.CANCELLED and run.reason == f"enough by {operator.username}"
    again = client.post(f"/api/training-runs/{run.pk}/cancel/", {}, format="json")
    assert again.status_code == 400 and "state" in again.json()


@pytest.mark.django_db
def test_the_schema_lists_the_run_endpoints(viewer: User) -> None:
    schema = api_client(viewer).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for path in ("/api/training-runs/", "/api/training-runs/{id}/", "/api/training-runs/{id}/cancel/",
                 "/api/training-runs/{id}/metrics/"):  # fmt: skip
        assert path in schema["paths"]


@pytest.mark.django_db
def test_ranks_that_do_not_divide_the_batch_answer_400_on_the_ranks_field(operator: User) -> None:
    response = api_client(operator).post(
        "/api/training-runs/",
        {"name": "ddp", "config": {"learners": {"batch_size": 6, "ranks": 4}, "stop": {"outer_steps": 3}}},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert response.json()["learners.ranks"] == [
        "must divide learners.batch_size (6): each rank draws batch_size / ranks"
    ]
    assert not TrainingRun.objects.exists()
