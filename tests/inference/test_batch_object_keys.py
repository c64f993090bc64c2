"""A batch job reads the object-store keys of its workflow's team only (issue 25, finding 6).

A team operator names as `input_uri` a key its workflow's team owns (`teams/<slug>/...`, or a
folder of one of its jobs); another team's input, a key that does not exist, the platform's keys
(exports, runs, old inputs) and a path that climbs out all get the same 400, before the store is
read, so the answer tells nobody which keys exist.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference.batch import jobs as batch
from inference.batch import lines as batch_lines
from inference.models import BatchJob
from registry.auth.roles import Role
from registry.models import Team
from registry.store.keys import object_key_team
from registry.store.objectstore import default_store
from tests.factories import api_client, make_member, make_team, make_user
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db

LINES = (
    json.dumps({"custom_id": "a", "messages": [{"role": "user", "content": "beta's secret prompt"}]}) + "\n"
)


@pytest.fixture(autouse=True)
def _own_store(settings: Any, tmp_path: Path) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"


@pytest.fixture
def world() -> dict[str, Any]:
    alpha, beta = make_team("alpha"), make_team("beta")
    alpha_operator = make_member(alpha, Role.OPERATOR)
    beta_operator = make_member(beta, Role.OPERATOR)
    alpha_wf = routed_workflow(alpha_operator, [priced_deployment()], team=alpha, slug="wf-alpha")
    beta_wf = routed_workflow(beta_operator, [priced_deployment()], team=beta, slug="wf-beta")
    beta_job = batch.batch_job_create(workflow=beta_wf, user=beta_operator, input_jsonl=LINES, enqueue=False)
    return {"alpha_operator": alpha_operator, "alpha_wf": alpha_wf, "beta_wf": beta_wf, "beta_job": beta_job}


def _post(user: Any, input_uri: str, workflow: str = "wf-alpha") -> Any:
    return api_client(user).post(
        "/api/batch-jobs/", {"workflow": workflow, "input_uri": input_uri}, format="json"
    )


def test_jsonl_text_is_stored_under_the_workflows_team_prefix(world: dict[str, Any]) -> None:
    key = world["beta_job"].input_uri
    assert key.startswith("teams/beta/inference/batch/inputs/") and key.endswith(".jsonl")
    assert default_store().get(key) == LINES.encode()
    assert object_key_team(key) == Team.objects.get(slug="beta").pk


def test_another_teams_input_and_a_missing_key_get_the_same_refusal(world: dict[str, Any]) -> None:
    theirs = _post(world["alpha_operator"], world["beta_job"].input_uri)
    missing = _post(world["alpha_operator"], "teams/beta/inference/batch/inputs/0123456789abcdef.jsonl")
    assert theirs.status_code == missing.status_code == 400
    assert theirs.json() == missing.json() == {"input_uri": [batch.INPUT_URI_REFUSED]}
    assert BatchJob.objects.filter(workflow=world["alpha_wf"]).count() == 0


def test_platform_keys_and_paths_that_climb_out_are_refused_alike(world: dict[str, Any]) -> None:
    store = default_store()
    store.put("exports/1/usage.csv", b"day,cost\n")
    store.put("inference/batch/inputs/old.jsonl", LINES.encode())  # stored before teams owned keys
    beta_job = world["beta_job"]
    store.put(batch_lines.output_key(beta_job), b'{"custom_id": "a"}\n')  # beta's job folder
    for key in (
        "exports/1/usage.csv",
        "inference/batch/inputs/old.jsonl",
        batch_lines.output_key(beta_job),
        f"teams/alpha/../beta/{beta_job.input_uri.removeprefix('teams/beta/')}",
        f"/{beta_job.input_uri}",
        f"file://{beta_job.input_uri}",
        "runs/1/exports/v1/config.json",
        "teams",
    ):
        response = _post(world["alpha_operator"], key)
        assert response.status_code == 400, key
        assert response.json() == {"input_uri": [batch.INPUT_URI_REFUSED]}, key
    assert BatchJob.objects.filter(workflow=world["alpha_wf"]).count() == 0


def test_a_member_of_both_teams_still_reads_only_the_workflows_teams_keys(world: dict[str, Any]) -> None:
    both = make_member("beta", Role.OPERATOR, user=world["alpha_operator"])
    client = api_client(both)  # a session: it reaches both teams
    response = client.post(
        "/api/batch-jobs/", {"workflow": "wf-alpha", "input_uri": world["beta_job"].input_uri}, format="json"
    )
    assert response.status_code == 400 and response.json() == {"input_uri": [batch.INPUT_URI_REFUSED]}


def test_a_team_operator_names_its_own_teams_keys(world: dict[str, Any]) -> None:
    default_store().put("teams/alpha/uploads/in.jsonl", LINES.encode())
    uploaded = _post(world["alpha_operator"], "teams/alpha/uploads/in.jsonl")
    assert uploaded.status_code == 201, uploaded.content

    own = batch.batch_job_create(
        workflow=world["alpha_wf"], user=world["alpha_operator"], input_jsonl=LINES, enqueue=False
    )
    again = _post(world["alpha_operator"], own.input_uri)
    assert again.status_code == 201, again.content
    assert BatchJob.objects.get(pk=again.json()["id"]).input_uri == own.input_uri

    # Its own key that does not exist is for it to know about.
    absent = _post(world["alpha_operator"], "teams/alpha/uploads/none.jsonl")
    assert absent.status_code == 400 and absent.json()["input_uri"][0].startswith("no object")


def test_a_platform_operator_names_any_key(world: dict[str, Any]) -> None:
    response = _post(make_user(Role.OPERATOR), world["beta_job"].input_uri, workflow="wf-alpha")
    assert response.status_code == 201, response.content
