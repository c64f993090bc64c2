"""Training run pages: list and detail for every role, the metrics JSON, the launch form, cancel."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.factories import fabricate_run
from training.models import TrainingRun


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "operator", "auditor", "admin_user"])
def test_list_and_detail_render_for_every_role(role: str, request: pytest.FixtureRequest) -> None:
    user = request.getfixturevalue(role)
    run = fabricate_run("visible")
    client = _client(user)
    listing = client.get("/training/")
    assert listing.status_code == 200
    assert f"/training/{run.pk}/" in listing.content.decode()
    sees_costs = role != "viewer"  # registry.auth.roles.can_see_costs
    assert ("4.50 USD" in listing.content.decode()) is sees_costs
    detail = client.get(f"/training/{run.pk}/")
    assert detail.status_code == 200
    html = detail.content.decode()
    for chart in ("loss_tokens", "loss_wall", "train_loss", "bytes", "merged"):
        assert f'id="chart-{chart}"' in html
    assert ('id="chart-loss_money"' in html) is sees_costs
    assert ("4.50 USD" in html) is sees_costs  # ledger cost so far
    assert ("1125.000000" in html) is sees_costs  # cost per 1M tokens
    assert "Cancel run" in html if role in ("operator", "admin_user") else "Cancel run" not in html
    assert 'id="run-rank-starts"' not in html  # its learners have one rank: no rank starts to show


@pytest.mark.django_db
def test_metrics_json_returns_figures_on_the_session(operator: User, viewer: User) -> None:
    run = fabricate_run()
    body = _client(operator).get(f"/training/{run.pk}/metrics.json").json()
    assert body["live"] is True and body["cost"] == "4.50 USD"
    loss = body["figures"]["loss_money"]["data"][0]
    assert loss["x"] == [0.0, 1.5, 4.5] and loss["y"] == [5.0, 4.0, 3.0]
    assert len(body["figures"]["train_loss"]["data"]) == 2
    assert "template" not in body["figures"]["train_loss"]["layout"]  # the page keeps its first one
    # A viewer gets the same page less its money: no cost, no loss-against-money chart.
    body = _client(viewer).get(f"/training/{run.pk}/metrics.json").json()
    assert "cost" not in body and "loss_money" not in body["figures"]
    assert len(body["figures"]["train_loss"]["data"]) == 2
    assert all("cost_so_far" not in v for v in body["series"]["versions"])


@pytest.mark.django_db
def test_anonymous_is_sent_to_login() -> None:
    assert Client().get("/training/").status_code == 302


@pytest.mark.django_db
def test_the_launch_form_is_prefilled_and_only_for_operators(operator: User, viewer: User) -> None:
    assert _client(viewer).get("/training/new/").status_code == 403
    page = _client(operator).get("/training/new/").content.decode()
    assert "outer_steps: 150" in page


@pytest.mark.django_db
def test_launch_form_shows_config_errors_and_keeps_the_input(
    operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    text = "learners:\n  count: 2\n  quorum: 7\nstop:\n  outer_steps: 3\n"
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _client(operator).post("/training/new/", {"name": "mine", "config": text})
    assert response.status_code == 400
    html = response.content.decode()
    assert "learners.quorum: must be between 1 and learners.count (2)" in html
    assert "quorum: 7" in html and 'value="mine"' in html
    assert not TrainingRun.objects.exists() and callbacks == []
    broken = _client(operator).post("/training/new/", {"name": "mine", "config": "{not json"})
    assert broken.status_code == 400 and "not valid YAML or JSON" in broken.content.decode()


@pytest.mark.django_db
def test_launch_form_creates_a_run_with_the_simple_fields_applied(
    operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = _client(operator).post(
            "/training/new/",
            {
                "name": "simple",
                "config": '{"stop": {"token_budget": 1000}}',
                "learners": "3",
                "outer_steps": "7",
            },
        )
    run = TrainingRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/training/{run.pk}/"
    assert run.config["learners"]["count"] == 3 and run.config["stop"] == {"outer_steps": 7}
    assert len(callbacks) == 1


@pytest.mark.django_db
def test_cancel_from_the_page(operator: User, viewer: User) -> None:
    run = fabricate_run()
    assert _client(viewer).post(f"/training/{run.pk}/cancel/", {"reason": "no"}).status_code == 403
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING
    response = _client(operator).post(f"/training/{run.pk}/cancel/", {"reason": "stop it"}, follow=True)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.CANCELLED
    assert f"Run #{run.pk} cancelled." in response.content.decode()
