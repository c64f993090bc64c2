"""The build_or_buy run option: refused with field messages when wrong, through the API too;
and beat's sweep makes the evaluation a lost signal never made."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from decisions.buildbuy import services as buildbuy
from decisions.models import VersionEvaluation
from inference.quality import services as quality
from registry.auth.roles import Role
from tests.factories import (
    api_client,
    fabricate_run,
    make_cluster,
    make_member,
    make_model,
    make_team,
    make_user,
    make_workflow,
    tiny_run_config,
)
from training.models import ModelVersion
from training.run_config import RunConfigError, run_config_validate

pytestmark = pytest.mark.django_db


def _errors(option: Any, **config: Any) -> dict[str, list[str]]:
    with pytest.raises(RunConfigError) as caught:
        run_config_validate(tiny_run_config(build_or_buy=option, **config))
    return caught.value.errors


def _scored_workflow(**fields: Any) -> Any:
    workflow = make_workflow(owner=make_user(Role.OPERATOR), **fields)
    quality.eval_set_create(
        workflow=workflow, name="set", cases=[{"prompt": "2+2?", "expected": "4", "scorer": "contains"}]
    )
    return workflow


def test_a_valid_option_is_normalised() -> None:
    workflow = _scored_workflow()
    cluster = make_cluster()
    cfg = run_config_validate(
        tiny_run_config(
            build_or_buy={
                "workflows": [workflow.slug, workflow.slug],
                "serve_cluster": cluster.slug,
                "volume_tokens_per_month": 1_000_000,
                "target_quality": 0.8,
            }
        )
    )
    assert cfg["build_or_buy"] == {
        "workflows": [workflow.slug],
        "serve_cluster": cluster.slug,
        "volume_tokens_per_month": 1_000_000,
        "horizon_months": 12,
        "target_quality": "0.8",
        "stop_when_buying_cheaper": False,
    }


def test_each_wrong_field_gets_its_own_message() -> None:
    errors = _errors(
        {
            "workflows": [],
            "serve_cluster": "nowhere",
            "volume_tokens_per_month": 0,
            "horizon_months": "12",
            "target_quality": 1.5,
            "stop_when_buying_cheaper": "yes",
            "colour": "red",
        }
    )
    assert errors["build_or_buy.workflows"] == ["must be a non-empty list of workflow slugs"]
    assert errors["build_or_buy.serve_cluster"] == ["no cluster 'nowhere'"]
    assert errors["build_or_buy.volume_tokens_per_month"] == ["must be between 1 and 1000000000000000"]
    assert errors["build_or_buy.horizon_months"] == ["must be an integer"]
    assert "must be a number in [0, 1]" in errors["build_or_buy.target_quality"][0]
    assert errors["build_or_buy.stop_when_buying_cheaper"] == ["must be true or false"]
    assert errors["build_or_buy.colour"] == ["unknown field"]
    assert _errors("yes")["build_or_buy"][0].startswith("must be an object")


def test_workflows_must_exist_belong_to_the_runs_team_and_have_an_eval_set() -> None:
    other_team = _scored_workflow(team="other")
    bare = make_workflow(owner=make_user(Role.OPERATOR))
    option = {"workflows": ["missing", other_team.slug], "volume_tokens_per_month": 10}
    assert _errors(option, team="mine")["build_or_buy.workflows"] == [
        "no workflow 'missing'",
        f"workflow {other_team.slug!r} is not team mine's",
    ]
    assert _errors({"workflows": [bare.slug], "volume_tokens_per_month": 10})["build_or_buy.workflows"] == [
        f"workflow {bare.slug!r} has no eval set with cases to score versions on"
    ]


def test_the_api_refuses_a_bad_option_with_field_messages() -> None:
    client = api_client(make_user(Role.OPERATOR))
    response = client.post(
        "/api/training-runs/",
        {"name": "bob", "config": tiny_run_config(build_or_buy={"workflows": ["nope"]})},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert body["build_or_buy.workflows"] == ["no workflow 'nope'"]
    assert body["build_or_buy.volume_tokens_per_month"] == ["required: the tokens a month to judge at"]


def test_the_sweep_makes_the_evaluation_a_lost_signal_never_made_once(
    django_capture_on_commit_callbacks: Any,
) -> None:
    workflow = _scored_workflow()
    run = fabricate_run()
    run.config = {
        **run.config,
        "build_or_buy": {"workflows": [workflow.slug], "volume_tokens_per_month": 10, "horizon_months": 1},
    }
    run.save(update_fields=["config"])
    # A version row whose signal was lost (written straight to the table, as if its process died
    # between COMMIT and the signal).
    version = ModelVersion.objects.create(
        registered_model=make_model(), number=1, run=run, key="1", global_version=1, artifact_uri="file:///x"
    )
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert buildbuy.version_evaluations_sweep() == []  # made now; fresh, so not "stale"
    assert len(queued) == 1  # its task is sent after COMMIT
    evaluation = VersionEvaluation.objects.get(model_version=version)
    assert evaluation.state == VersionEvaluation.State.PENDING and evaluation.run == run
    with django_capture_on_commit_callbacks(execute=False) as again:
        buildbuy.version_evaluations_sweep()
    assert VersionEvaluation.objects.filter(model_version=version).count() == 1
    # Still pending and not yet stale: the queued message will claim it; nothing is sent twice.
    assert again == []


def test_an_evaluation_claimed_by_a_dead_worker_is_queued_again_and_taken_over_once(
    django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.BUILD_OR_BUY_STALE_SECONDS = 60.0
    run = fabricate_run()
    version = ModelVersion.objects.create(
        registered_model=make_model(), number=1, run=run, key="1", global_version=1, artifact_uri="file:///x"
    )
    now = timezone.now()
    evaluation = VersionEvaluation.objects.create(
        model_version=version,
        run=run,
        state=VersionEvaluation.State.RUNNING,
        claimed_at=now - timedelta(seconds=30),
        attempts=1,
    )
    with django_capture_on_commit_callbacks(execute=False) as fresh:
        assert buildbuy.version_evaluations_sweep() == []  # its worker may still be at it
    assert fresh == [] and not buildbuy._claim(evaluation.pk)
    VersionEvaluation.objects.filter(pk=evaluation.pk).update(claimed_at=now - timedelta(seconds=120))
    with django_capture_on_commit_callbacks(execute=False) as stale:
        assert buildbuy.version_evaluations_sweep() == [evaluation.pk]
    assert len(stale) == 1
    # Two deliveries of the re-queued message: one takes the claim over, the other finds it held.
    assert buildbuy._claim(evaluation.pk) and not buildbuy._claim(evaluation.pk)
    evaluation.refresh_from_db()
    assert evaluation.attempts == 2 and evaluation.state == VersionEvaluation.State.RUNNING


def test_the_report_is_team_scoped_like_the_run() -> None:
    run = fabricate_run()
    run.team = make_team("alpha")
    run.save(update_fields=["team"])
    url = f"/api/decisions/training-runs/{run.pk}/build-or-buy/"
    mine = api_client(make_member("alpha", Role.OPERATOR)).get(url)
    assert mine.status_code == 200 and mine.json()["enabled"] is False
    assert mine.json()["run_spend"] == "4.500000000"  # fabricate_run's ledger rows
    assert api_client(make_member("bravo", Role.OPERATOR)).get(url).status_code == 404
