"""Where rate limits are set: a workflow's (API and page) and a token's (page and command), with
negative or oversized limits refused with field messages, a form error or one line."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from registry.models import ApiToken, Workflow
from registry.services import api_token_create
from tests.factories import api_client, make_deployment, make_workflow

pytestmark = pytest.mark.django_db


def _page_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_workflow_takes_its_limits_through_the_api_and_refuses_negatives(operator: User) -> None:
    make_deployment(slug="a")
    client = api_client(operator)
    route = {"deployments": ["a"]}
    bad = client.post("/api/workflows/", {"slug": "wf", "route": route, "rpm_limit": -1}, format="json")
    assert bad.status_code == 400
    assert "rpm_limit" in bad.json()
    assert not Workflow.objects.exists()
    made = client.post(
        "/api/workflows/", {"slug": "wf", "route": route, "rpm_limit": 60, "tpm_limit": 1000}, format="json"
    )
    assert made.status_code == 201, made.json()
    assert (made.json()["rpm_limit"], made.json()["tpm_limit"]) == (60, 1000)
    changed = client.patch("/api/workflows/wf/", {"tpm_limit": -5}, format="json")
    assert changed.status_code == 400
    assert "tpm_limit" in changed.json()
    cleared = client.patch("/api/workflows/wf/", {"rpm_limit": None}, format="json")
    assert cleared.status_code == 200
    workflow = Workflow.objects.get(slug="wf")
    assert (workflow.rpm_limit, workflow.tpm_limit) == (None, 1000)


def test_the_new_workflow_page_takes_limits_and_shows_a_form_error_for_a_negative(operator: User) -> None:
    deployment = make_deployment(slug="a")
    client = _page_client(operator)
    form = {"slug": "wf", "deployments": [deployment.pk], "rpm_limit": "-3"}
    refused = client.post("/workflows/new/", form)
    assert b"greater than or equal to 0" in refused.content
    assert not Workflow.objects.exists()
    client.post("/workflows/new/", {**form, "rpm_limit": "30"})
    assert Workflow.objects.get(slug="wf").rpm_limit == 30


def test_a_token_gets_its_limits_on_the_tokens_page_and_negatives_are_form_errors(viewer: User) -> None:
    client = _page_client(viewer)
    refused = client.post("/tokens/", {"name": "laptop", "tpm_limit": "-1"})
    assert refused.status_code == 400
    assert not ApiToken.objects.exists()
    client.post("/tokens/", {"name": "laptop", "rpm_limit": "60", "rate_limit_fail_closed": "on"})
    token = ApiToken.objects.get()
    assert (token.rpm_limit, token.tpm_limit, token.rate_limit_fail_closed) == (60, None, True)
    bad_edit = client.post("/tokens/", {"limits": token.pk, "rpm_limit": "-2"})
    assert bad_edit.status_code == 400
    assert b"Requests per minute" in bad_edit.content
    # Its owner may lower its limits (a limit where there was none is lower)...
    client.post(
        "/tokens/",
        {"limits": token.pk, "rpm_limit": "30", "tpm_limit": "5000", "rate_limit_fail_closed": "on"},
    )
    token.refresh_from_db()
    assert (token.rpm_limit, token.tpm_limit, token.rate_limit_fail_closed) == (30, 5000, True)
    # ...but not clear one (raising is for the platform or the team's admin): a form error.
    cleared = client.post("/tokens/", {"limits": token.pk, "rpm_limit": "", "tpm_limit": "5000"})
    assert cleared.status_code == 400
    token.refresh_from_db()
    assert (token.rpm_limit, token.tpm_limit) == (30, 5000)


def test_another_users_token_limits_are_not_found(viewer: User, operator: User) -> None:
    token, _ = api_token_create(user=viewer, name="mine")
    response = _page_client(operator).post("/tokens/", {"limits": token.pk, "rpm_limit": "1"})
    assert response.status_code == 404
    token.refresh_from_db()
    assert token.rpm_limit is None


def test_the_apitoken_command_sets_limits_and_refuses_a_negative_in_one_line(viewer: User) -> None:
    call_command("apitoken", "create", "--user", viewer.username, "--rpm", "10", "--tpm", "100")
    token = ApiToken.objects.get()
    assert (token.rpm_limit, token.tpm_limit) == (10, 100)
    with pytest.raises(CommandError, match="rate limit"):
        call_command("apitoken", "limits", token.prefix, "--rpm", "-1")
    call_command("apitoken", "limits", token.prefix, "--tpm", "7", "--fail-closed")
    token.refresh_from_db()
    assert (token.rpm_limit, token.tpm_limit, token.rate_limit_fail_closed) == (None, 7, True)


def test_a_workflow_made_in_code_has_no_limits(operator: User) -> None:
    workflow = make_workflow(owner=operator)
    assert (workflow.rpm_limit, workflow.tpm_limit) == (None, None)
