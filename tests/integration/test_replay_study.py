"""A replay study asked for through the API and run by a real control worker: 100 kept requests
over two candidate deployments, journaled recording as in production, figures that reconcile
with the ledger, the replay's objects (kept prompts) deleted at the end; the worker derives the
recommendation (issue 18's done-when), and accepting it writes a policy version citing it."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections
from django.test import Client

from bench.mockprovider import Behaviour, MockProviderServer
from decisions.models import Recommendation, ReplayStudy
from decisions.recommendations.selectors import recommendation_reconcile
from decisions.replay.steps import replay_ledger_total
from inference.models import BatchJob, RetainedPrompt
from inference.selectors import route_plan_build
from registry.auth.roles import Role
from registry.services import api_token_create
from registry.store.objectstore import default_store
from tests.factories import api_client, make_user
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.processes import Processes, wait_until

pytestmark = pytest.mark.integration
KEPT = 100


def _study(pk: int) -> ReplayStudy | None:
    close_old_connections()
    study = ReplayStudy.objects.get(pk=pk)
    return study if study.state in (ReplayStudy.State.SUCCEEDED, ReplayStudy.State.FAILED) else None


def _proposal(study_id: int) -> Recommendation | None:
    close_old_connections()
    return Recommendation.objects.filter(study_id=study_id).first()


def test_a_replay_study_runs_on_the_control_worker_reconciles_and_its_recommendation_is_accepted(
    processes: Processes, settings: Any, tmp_path: Path
) -> None:
    store_url = f"file://{tmp_path / 'objects'}"
    settings.OBJECT_STORE_URL = store_url
    primary_server = MockProviderServer(Behaviour(text="pong")).start()
    other_server = MockProviderServer(Behaviour(text="pong", tokens_in=5, tokens_out=2)).start()
    try:
        operator = make_user(Role.OPERATOR)
        primary = priced_deployment(primary_server)
        other = priced_deployment(other_server, in_price=Decimal("0.5"), out_price=Decimal("2"))
        workflow = routed_workflow(operator, [primary], retain_prompts=True, prompt_retention_days=7)
        _, raw = api_token_create(user=operator, name="traffic")
        gateway = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
        for i in range(KEPT):
            body = {"model": workflow.slug, "messages": [{"role": "user", "content": f"ticket {i}"}]}
            answer = gateway.post("/v1/chat/completions", json.dumps(body), content_type="application/json")
            assert answer.status_code == 200
        ledger_settled()  # the fold writes the kept prompts
        assert RetainedPrompt.objects.filter(workflow=workflow).count() == KEPT

        processes.start(
            "control",
            "worker",
            "--control",
            "--loglevel",
            "warning",
            env={"OBJECT_STORE_URL": store_url, "SWITCHYARD_INFERENCE_RECORDING": "journal"},
        )
        response = api_client(operator).post(
            "/api/replay-studies/",
            {"workflow": workflow.slug, "deployments": [other.slug], "sample_size": KEPT, "scorer": "exact"},
            format="json",
        )
        assert response.status_code == 201, response.content
        study = wait_until(
            lambda: _study(response.json()["id"]),
            timeout=300,
            what="the replay study\n" + processes.log("control"),
        )
        assert study.state == ReplayStudy.State.SUCCEEDED, study.error
        candidates = {c.deployment_id: c for c in study.candidates.all()}
        assert set(candidates) == {primary.pk, other.pk}  # the baseline joined the named candidate
        for candidate in candidates.values():
            assert (candidate.requests, candidate.succeeded) == (KEPT, KEPT)
            assert candidate.cost_total == replay_ledger_total(candidate=candidate) > 0
            job = BatchJob.objects.get(pk=candidate.batch_job_id)
            assert job.cost == candidate.cost_total and job.holds_prompts_until is None
            assert candidate.quality_mean == Decimal("1.0000")
        assert candidates[other.pk].cost_per_1m_requests < candidates[primary.pk].cost_per_1m_requests
        assert candidates[other.pk].paired_requests == KEPT
        assert default_store().list("inference/batch/jobs/") == []  # inputs, parts and outputs: gone

        # The worker derives the verdict once the replayed requests' ledger rows are folded:
        # the cheaper candidate answers as well on every request, so it is proposed.
        proposal = wait_until(
            lambda: _proposal(study.pk),
            timeout=300,
            what="the recommendation\n" + processes.log("control"),
        )
        assert (proposal.state, proposal.from_deployment_id, proposal.to_deployment_id) == (
            Recommendation.State.PROPOSED,
            primary.pk,
            other.pk,
        )
        assert proposal.replayed_requests == KEPT and proposal.cost_change_percent < 0
        # The evidence's money is the ledger's, to the cent (to the nano-dollar, in fact).
        assert proposal.ledger_amount_after == candidates[other.pk].cost_total
        assert proposal.ledger_amount_before == candidates[primary.pk].cost_total
        assert recommendation_reconcile(recommendation=proposal).matches

        accepted = api_client(operator).post(f"/api/recommendations/{proposal.pk}/accept/", format="json")
        assert accepted.status_code == 200, accepted.content
        proposal.refresh_from_db()
        policy = proposal.accepted_policy_version
        assert proposal.state == Recommendation.State.ACCEPTED and policy is not None
        assert f"recommendation #{proposal.pk}" in policy.reason
        assert f"/decisions/recommendations/{proposal.pk}/" in policy.reason
        plan = route_plan_build(workflow_id=workflow.pk)
        assert plan is not None and [e.deployment.pk for e in plan.entries] == [other.pk, primary.pk]
    finally:
        primary_server.stop()
        other_server.stop()
