"""The batch tests' own object store and their team, workflow, key and SDK client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from billing.models import Unit
from registry.auth.roles import Role
from registry.services import api_token_create
from tests.factories import make_member, make_price, make_team
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.openai_batches import BATCH_IN, BATCH_OUT
from tests.inference.recording_provider import RecordingProvider


@pytest.fixture(autouse=True)
def _own_store(settings: Any, tmp_path: Path) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    settings.INFERENCE_BATCH_PART_LINES = 2


@pytest.fixture
def team_setup(live_server: Any, provider: RecordingProvider) -> dict[str, Any]:
    """A team's workflow on the recording provider (with batch prices), a key of the team, and
    the SDK client on that key."""
    team = make_team("alpha")
    member = make_member(team, Role.OPERATOR)
    deployment = priced_deployment(base_url=provider.base_url, provider_model_id="provider-model")
    deployment.supports_embeddings = True
    deployment.save()
    make_price(unit=Unit.BATCH_INPUT_TOKENS_1M, unit_price=BATCH_IN, deployment=deployment)
    make_price(unit=Unit.BATCH_OUTPUT_TOKENS_1M, unit_price=BATCH_OUT, deployment=deployment)
    workflow = routed_workflow(member, [deployment], team=team)
    token, raw = api_token_create(user=member, name="batches", team=team)
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    return {"team": team, "member": member, "workflow": workflow, "token": token, "client": client}
