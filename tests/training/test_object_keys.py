"""A run reads the object-store keys of its own team only (issue 25, finding 2).

The store's `runs/` holds every team's exports. A team-scoped caller names, as model_uri,
tokenizer_uri or dataset, only keys its run's team owns (`runs/<id>/` of that team's runs,
`teams/<slug>/`); another team's key, a key that does not exist and a path that climbs or links
out all get one message, before anything looks at the path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from registry.auth.roles import Role
from registry.models import Team
from registry.store.keys import ObjectReach, object_key_team
from registry.store.objectstore import object_store_key
from tests.factories import api_client, make_member, make_model, make_team, make_user, tiny_run_config
from training.models import ModelVersion, TrainingRun
from training.run_config import DATASET_REFUSED, OBJECT_REFUSED

pytestmark = pytest.mark.django_db


@pytest.fixture
def store(tmp_path: Path, settings: Any) -> Path:
    """The installation's store, and a data root beside it (outside it)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_text("some words to train on\n" * 50)
    settings.TRAINING_DATA_ROOTS = [f"file://{tmp_path / 'data'}"]
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    return tmp_path / "objects"


def _run_of(team: Team) -> TrainingRun:
    return TrainingRun.objects.create(
        name=f"{team.slug}-run", config=tiny_run_config(team=team.slug), team=team
    )


def _model_dir(path: Path) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "tokenizer.json").write_text("{}")
    return f"file://{path}"


def _config(store: Path, **overrides: Any) -> dict[str, Any]:
    return {
        "team": "alpha",
        "dataset": f"file://{store.parent / 'data' / 'corpus.txt'}",
        "data": {"format": "text"},
        "stop": {"outer_steps": 1},
        **overrides,
    }


def _launch(user: Any, config: dict[str, Any]) -> Any:
    return api_client(user).post("/api/training-runs/", {"name": "r", "config": config}, format="json")


@pytest.fixture
def teams(store: Path) -> dict[str, Any]:
    alpha, beta = make_team("alpha"), make_team("beta")
    alpha_run, beta_run = _run_of(alpha), _run_of(beta)
    return {
        "alpha_operator": make_member(alpha, Role.OPERATOR),
        "alpha_export": _model_dir(store / "runs" / str(alpha_run.pk) / "exports" / "v1"),
        "beta_export": _model_dir(store / "runs" / str(beta_run.pk) / "exports" / "v1"),
        "beta_run": beta_run,
    }


def test_a_team_operator_naming_another_teams_export_or_a_missing_one_gets_one_message(
    store: Path, teams: dict[str, Any]
) -> None:
    before = TrainingRun.objects.count()
    theirs = _launch(teams["alpha_operator"], _config(store, model_uri=teams["beta_export"]))
    missing = _launch(
        teams["alpha_operator"], _config(store, model_uri=f"file://{store}/runs/999999/exports/v1")
    )
    absent_team = _launch(
        teams["alpha_operator"], _config(store, model_uri=f"file://{store}/teams/beta/models/m")
    )

    assert theirs.status_code == missing.status_code == absent_team.status_code == 400
    assert theirs.json() == missing.json() == absent_team.json() == {"model_uri": [OBJECT_REFUSED]}
    assert TrainingRun.objects.count() == before


def test_a_team_operator_cannot_take_another_teams_tokenizer_or_dataset_from_the_store(
    store: Path, teams: dict[str, Any], settings: Any
) -> None:
    # An admin who lists the whole store as a data root does not open every team's keys.
    settings.TRAINING_DATA_ROOTS = [*settings.TRAINING_DATA_ROOTS, f"file://{store}"]
    beta_export = teams["beta_export"]
    response = _launch(
        teams["alpha_operator"],
        _config(
            store,
            model_uri=teams["alpha_export"],
            tokenizer_uri=f"{beta_export}/tokenizer.json",
            dataset=f"{beta_export}/tokenizer.json",
        ),
    )
    assert response.status_code == 400
    assert response.json() == {"tokenizer_uri": [OBJECT_REFUSED], "dataset": [DATASET_REFUSED]}


def test_a_team_operator_names_its_own_teams_exports_and_team_folder(
    store: Path, teams: dict[str, Any]
) -> None:
    own = _launch(teams["alpha_operator"], _config(store, model_uri=teams["alpha_export"]))
    assert own.status_code == 201, own.content
    assert TrainingRun.objects.get(pk=own.json()["id"]).config["model_uri"] == teams["alpha_export"]

    folder = _model_dir(store / "teams" / "alpha" / "models" / "m1")
    kept = _launch(
        teams["alpha_operator"], _config(store, model_uri=folder, tokenizer_uri=f"{folder}/tokenizer.json")
    )
    assert kept.status_code == 201, kept.content


def test_a_path_that_climbs_or_links_into_another_teams_export_is_refused_alike(
    store: Path, teams: dict[str, Any]
) -> None:
    alpha_folder = store / "teams" / "alpha" / "models"
    alpha_folder.mkdir(parents=True)
    (alpha_folder / "link").symlink_to(Path(teams["beta_export"][len("file://") :]))
    beta_run = teams["beta_run"].pk
    for uri in (
        f"file://{alpha_folder / 'link'}",
        f"file://{store}/teams/alpha/../../runs/{beta_run}/exports/v1",
        f"file://{store}/runs/0{beta_run}/exports/v1",
        "file:///etc",
        f"s3://another-bucket/runs/{beta_run}/exports/v1",
    ):
        response = _launch(teams["alpha_operator"], _config(store, model_uri=uri))
        assert response.status_code == 400, uri
        assert response.json() == {"model_uri": [OBJECT_REFUSED]}, uri


def test_a_member_of_both_teams_reads_only_the_runs_own_teams_keys(
    store: Path, teams: dict[str, Any]
) -> None:
    """Roles are per team, never a union: operating beta too does not let an alpha run read beta's."""
    both = make_member("beta", Role.OPERATOR, user=teams["alpha_operator"])
    alpha = Team.objects.get(slug="alpha")
    client = api_client(both, team=alpha)
    response = client.post(
        "/api/training-runs/",
        {"name": "r", "config": _config(store, model_uri=teams["beta_export"])},
        format="json",
    )
    assert response.status_code == 400 and response.json() == {"model_uri": [OBJECT_REFUSED]}

    version = ModelVersion.objects.create(
        registered_model=make_model(),
        number=1,
        run=teams["beta_run"],
        key="final",
        global_version=1,
        final=True,
        artifact_uri=teams["beta_export"],
        layout=ModelVersion.Layout.OPEN_WEIGHTS,
    )
    client.force_login(both)  # a session reaches both teams: still only the run's own
    started = client.post(
        "/api/training-runs/",
        {"name": "r", "config": _config(store, start_from={"model_version": version.pk, "mode": "finetune"})},
        format="json",
    )
    assert started.status_code == 400
    assert list(started.json()) == ["start_from.model_version"]


def test_a_platform_operator_still_names_any_runs_export(store: Path, teams: dict[str, Any]) -> None:
    response = _launch(make_user(Role.OPERATOR), _config(store, model_uri=teams["beta_export"]))
    assert response.status_code == 201, response.content


def test_the_launch_page_refuses_another_teams_export_with_a_form_error(
    store: Path, teams: dict[str, Any]
) -> None:
    page = Client()
    page.force_login(teams["alpha_operator"])
    config = _config(store, model_uri=teams["beta_export"])
    response = page.post(
        "/training/new/",
        {"name": "r", "team": "alpha", "config": json.dumps(config)},
    )
    assert response.status_code == 400
    assert OBJECT_REFUSED in response.content.decode()
    assert not TrainingRun.objects.filter(name="r").exists()


def test_who_owns_a_key() -> None:
    alpha = make_team("alpha")
    run = _run_of(alpha)
    platform_run = TrainingRun.objects.create(name="p", config=tiny_run_config())
    assert object_key_team(f"runs/{run.pk}/exports/v1/config.json") == alpha.pk
    assert object_key_team(f"runs/{platform_run.pk}/exports/v1") is None
    assert object_key_team("teams/alpha/x.jsonl") == alpha.pk
    assert object_key_team("teams/nobody/x.jsonl") is None
    assert object_key_team("exports/1/manifest.json") is None
    reach = ObjectReach(teams=frozenset({alpha.pk}), team_id=alpha.pk)
    assert reach.may_read("teams/alpha/x.jsonl")
    for bad in ("teams/alpha/../beta/x", "/teams/alpha/x", "teams//alpha/x", "file://teams/alpha/x", ""):
        assert not reach.may_read(bad), bad
    assert not ObjectReach(teams=frozenset({alpha.pk}), team_id=None).may_read("teams/alpha/x.jsonl")


def test_an_s3_uri_is_a_key_of_the_store_only_in_its_bucket_and_prefix(settings: Any) -> None:
    settings.OBJECT_STORE_URL = "s3://switchyard/objects"
    assert object_store_key("s3://switchyard/objects/runs/2/exports/v1/") == "runs/2/exports/v1"
    assert object_store_key("s3://switchyard/objects") == ""
    assert object_store_key("s3://switchyard/objects-other/runs/2") is None
    assert object_store_key("s3://another-bucket/objects/runs/2") is None
    assert object_store_key("file:///srv/objects/runs/2") is None


def test_a_team_operator_cannot_name_another_teams_export_in_an_s3_store(settings: Any) -> None:
    settings.OBJECT_STORE_URL = "s3://switchyard/objects"
    settings.TRAINING_DATA_ROOTS = ["s3://corpora"]
    alpha, beta = make_team("alpha"), make_team("beta")
    alpha_run, beta_run = _run_of(alpha), _run_of(beta)
    operator = make_member(alpha, Role.OPERATOR)
    config = {
        "team": "alpha",
        "dataset": "s3://corpora/text/",
        "data": {"format": "text"},
        "stop": {"outer_steps": 1},
    }
    theirs = _launch(
        operator, {**config, "model_uri": f"s3://switchyard/objects/runs/{beta_run.pk}/exports/v1/"}
    )
    assert theirs.status_code == 400 and theirs.json() == {"model_uri": [OBJECT_REFUSED]}
    own = _launch(
        operator, {**config, "model_uri": f"s3://switchyard/objects/runs/{alpha_run.pk}/exports/v1/"}
    )
    assert own.status_code == 201, own.content
