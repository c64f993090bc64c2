"""A replay study asked for through the API and run by a real control worker: 100 kept requests
over two candidate deployments, journaled recording as in production, figures that reconcile
with the ledger, the replay's objects (kept prompts) deleted at the end."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections
from django.test import Client

from inference.mockprovider import Behaviour, MockProviderServer
from inference.models import BatchJob, RetainedPrompt
from stack.decisions.models import ReplayStudy
from stack.decisions.replay import replay_ledger_total
from stack.registry.objectstore import default_store
from stack.registry.roles import Role
from stack.registry.services import api_token_create
from tests.factories import api_client, make_user
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.processes import Processes, wait_until

pytestmark = pytest.mark.integration
KEPT = 100


def _study(pk: int) -> ReplayStudy | None:
    close_old_connections()
    study = ReplayStudy.objects.get(pk=pk)
    return study if study.state in (ReplayStudy.State.SUCCEEDED, ReplayStudy.State.FAILED) else None


def test_a_replay_study_runs_on_the_control_worker_and_reconciles_with_the_ledger(
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
        assert default_store().list("inference/batch/") == []  # inputs, parts and outputs: gone
    finally:
        primary_server.stop()
        other_server.stop()
