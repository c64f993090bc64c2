"""`manage.py serve_model` round trip: a tiny artifact written by storage.artifacts, served by a
real subprocess, routed to through a self-hosted deployment on a cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from billing.models import Unit, UsageRecord
from inference.adapters.base import ChatMessage, ChatRequest, CompletionRequest
from inference.adapters.openai_compat import OpenAICompatibleAdapter
from inference.router.entry import route
from inference.serving.local import local_server_for_artifact
from inference.stats_selectors import deployment_price_per_1m
from registry.models import Provider
from tests.factories import (
    make_cluster,
    make_deployment,
    make_price,
    make_provider,
    make_workflow,
)
from tests.helpers import ledger_settled
from tests.integration.processes import session_database_url as database_url_for_children

pytestmark = pytest.mark.integration


def test_served_artifact_answers_like_the_model_in_process(
    served: tuple[Any, str, str], admin_user: User
) -> None:
    model, uri, base_url = served
    cluster = make_cluster(provider=make_provider(kind=Provider.Kind.ON_PREM), price=Decimal("1.2"))
    local = make_deployment(
        model=model,
        provider=cluster.provider,
        hosting_cluster=cluster,
        base_url=base_url,
        provider_model_id=model.slug,
    )
    for unit in (Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M):
        make_price(deployment=local, unit=unit, unit_price=Decimal("0"))
    workflow = make_workflow(owner=admin_user, deployments=[local])

    result = route(workflow=workflow, request=CompletionRequest(prompt="hello", max_tokens=12))
    assert result.ok and result.deployment_slug == local.slug
    assert result.completion is not None
    assert (result.completion.tokens_in, result.completion.tokens_out) == (5, 12)  # bytes in, bytes out

    # The same artifact, loaded here, generates the same bytes greedily.
    reference = local_server_for_artifact(uri=uri, name="ref")
    try:
        pieces, _, _ = reference.generator.generate("hello", max_tokens=12)
    finally:
        reference.server_close()
    assert result.completion.text == b"".join(pieces).decode("utf-8", "replace")

    # Streaming chat through the adapter, and the models list.
    chunks = list(
        OpenAICompatibleAdapter().stream(
            route_target(local), ChatRequest(messages=(ChatMessage("user", "hi"),), max_tokens=6), timeout=30
        )
    )
    assert chunks[-1].tokens_out == 6
    with urllib.request.urlopen(f"{base_url}/models", timeout=5) as answer:  # noqa: S310 (loopback)
        assert b"tiny-gpt" in answer.read()

    # Tokens are in the ledger at the zero token price; the $/1M figure is billing's.
    ledger_settled()
    usage = UsageRecord.objects.filter(deployment=local, subject_type="inference_request")
    assert sorted(usage.values_list("unit", "quantity")) == [
        ("input_tokens_1m", Decimal("0.000005000")),
        ("output_tokens_1m", Decimal("0.000012000")),
    ]
    price = deployment_price_per_1m(deployment=local)
    assert price.self_hosted and price.per_1m_input == Decimal("0")  # no accelerator-hours billed yet


def route_target(deployment: Any) -> Any:
    from inference.selectors import route_plan_build

    plan = route_plan_build(workflow_id=deployment.policy_versions.first().workflow_id)
    assert plan is not None
    return plan.entries[0].target


def test_serve_model_refuses_an_unknown_model(transactional_db: Any) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(Path(settings.BASE_DIR) / "manage.py"),
            "serve_model",
            "--model",
            "nope",
            "--port",
            "1",
        ],
        env={**os.environ, "DATABASE_URL": database_url_for_children()},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "no registered model 'nope'" in done.stderr
