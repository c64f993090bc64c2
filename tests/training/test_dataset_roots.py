"""A run reads data only under the roots an admin configured, and writes only to the installation's
object store: every other dataset gets the same answer whether it exists or not (no file-existence
oracle), and `object_store_url` is not the run's to choose. Model artifacts likewise stay inside
the store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from registry.models import RegisteredModel
from registry.store.objectstore import STORE_URI_REFUSED
from tests.factories import api_client
from training.models import TrainingRun
from training.run_config import DATASET_REFUSED, RunConfig, run_config_validate

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(tmp_path: Path, settings: Any) -> Path:
    """A data root with one corpus file, a symlink out of it, and an S3 root beside it."""
    data = tmp_path / "datasets"
    (data / "corpus").mkdir(parents=True)
    (data / "corpus" / "a.txt").write_text("hello world " * 100)
    (data / "link-out").symlink_to("/etc")
    (data / "corpus-evil").mkdir()
    settings.TRAINING_DATA_ROOTS = [f"file://{data}", "s3://bucket/corpora"]
    return data


def _launch(user: User, dataset: Any, **extra: Any) -> Any:
    config = {"dataset": dataset, "stop": {"outer_steps": 3}, **extra}
    return api_client(user).post("/api/training-runs/", {"name": "r", "config": config}, format="json")


def test_every_refused_dataset_gets_the_same_answer_whether_or_not_it_exists(
    operator: User, root: Path
) -> None:
    refused = [
        "/etc/shadow",
        "file:///etc/shadow",
        "file:///",
        "/proc/self/environ",
        "file:///proc/self/environ",
        "file:///no/such/file",
        f"file://{root}/corpus/missing.txt",
        f"file://{root}/../../etc/passwd",
        f"file://{root}/corpus/../../datasets/corpus",
        f"file://{root}/link-out/passwd",
        f"file://{root}/link-out",
        f"file://{root}-sibling",
        "file://localhost/etc/passwd",
        "s3://other-bucket/corpora",
        "s3://bucket/corpora-evil/x",
        "s3://bucket/corpora/../secrets",
        "ftp://nowhere/x",
        "",
        7,
    ]
    answers = []
    for dataset in refused:
        response = _launch(operator, dataset)
        assert response.status_code == 400, (dataset, response.content)
        answers.append(response.json())
    assert all(a == {"dataset": [DATASET_REFUSED]} for a in answers), answers
    assert not TrainingRun.objects.exists()


def test_datasets_under_a_root_and_the_stdlib_corpus_are_accepted(operator: User, root: Path) -> None:
    for dataset in (
        "stdlib://",
        f"file://{root}/corpus",
        f"file://{root}/corpus/a.txt",
        "s3://bucket/corpora/x",
    ):
        assert _launch(operator, dataset).status_code == 201, dataset


def test_without_configured_roots_only_the_stdlib_corpus_is_allowed(operator: User, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    assert _launch(operator, f"file://{tmp_path}/a.txt").json() == {"dataset": [DATASET_REFUSED]}
    assert _launch(operator, "stdlib://").status_code == 201


def test_a_symlink_made_after_validation_is_not_followed_out_of_the_root(root: Path) -> None:
    cfg = run_config_validate({"dataset": f"file://{root}/corpus", "stop": {"outer_steps": 3}})
    os.symlink("/etc/hostname", root / "corpus" / "b.txt")
    paths = RunConfig(cfg).data_config().paths
    assert paths == (str(root / "corpus" / "a.txt"),)


def test_a_run_whose_root_was_removed_reads_nothing(root: Path, settings: Any) -> None:
    cfg = run_config_validate({"dataset": f"file://{root}/corpus", "stop": {"outer_steps": 3}})
    settings.TRAINING_DATA_ROOTS = []
    with pytest.raises(ValueError, match="dataset: must be stdlib://"):
        RunConfig(cfg).data_config()


def test_a_run_cannot_choose_its_object_store(operator: User, settings: Any) -> None:
    for url in ("s3://attacker-bucket/x", "file:///etc", settings.OBJECT_STORE_URL):
        response = _launch(operator, "stdlib://", object_store_url=url)
        assert response.status_code == 400
        assert response.json() == {
            "object_store_url": ["a run cannot choose its object store: every run uses OBJECT_STORE_URL"]
        }
    assert not TrainingRun.objects.exists()
    # A config stored by an older version that named another store is ignored.
    assert (
        RunConfig({"object_store_url": "s3://attacker-bucket/x"}).object_store_url
        == settings.OBJECT_STORE_URL
    )


def test_a_model_artifact_must_lie_inside_the_object_store(
    operator: User, settings: Any, tmp_path: Path
) -> None:
    store = tmp_path / "objects"
    (store / "models").mkdir(parents=True)
    (tmp_path / "outside").symlink_to("/etc")
    (store / "models" / "escape").symlink_to("/etc")
    settings.OBJECT_STORE_URL = f"file://{store}"
    client = api_client(operator)
    for uri in (
        "file:///etc/shadow",
        f"file://{store}/../outside/shadow",
        f"file://{store}/models/escape/shadow",
        f"file://{store}",
        "s3://other-bucket/model.bin",
        "http://example.com/m.bin",
    ):
        response = client.post(
            "/api/models/", {"slug": "m", "family": "f", "artifact_uri": uri}, format="json"
        )
        assert response.status_code == 400, uri
        assert response.json() == {"artifact_uri": [STORE_URI_REFUSED]}
    inside = client.post(
        "/api/models/",
        {"slug": "m", "family": "f", "artifact_uri": f"file://{store}/models/m.syd"},
        format="json",
    )
    assert inside.status_code == 201, inside.content
    assert RegisteredModel.objects.get(slug="m").artifact_uri == f"file://{store}/models/m.syd"
