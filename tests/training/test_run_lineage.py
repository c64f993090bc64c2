"""Checkpoints and lineage: model versions every k global versions, runs that start from one,
the final open-weights export, and serve_model answering from it.

A tiny Llama with its own BPE tokenizer trains on a JSONL dataset in S3 (moto's server); the
syncer ticks register every 2nd global version once, however often they run; a second run
continues from a registered version (its version 0 is that version's weights); the final
export reloads with identical parameters, and a real `serve_model` process answers a chat
request from it through the exported tokenizer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from django.conf import settings as django_settings
from django.utils import timezone
from rest_framework.test import APIClient

from billing.money import shown_text
from inference.serving.local import local_server_for_artifact
from registry.models import Cluster, RegisteredModel
from storage.objectstore import open_store
from tests.factories import make_cluster, tiny_run_config
from tests.integration.processes import session_database_url, stop_process
from tests.training.engine.tiny_open_weights import (
    jsonl,
    random_weights,
    sentences,
    tiny_llama_hf,
    tiny_tokenizer_json,
    write_model_by_hand,
)
from training import orchestrator, services
from training.engine.openweights import read_model_dir
from training.models import GlobalVersionRecord, ModelVersion, TrainingLearner, TrainingRun
from training.run_config import RunConfigError, run_config_validate
from training.run_engines import newest_global, run_engine, run_transport, version_params
from training.services.lineage import model_versions_register_due


@pytest.fixture(autouse=True)
def _data_roots(tmp_path: Path, settings: Any) -> None:
    """What an admin would list: this test's directory (the brought model lives there)."""
    settings.TRAINING_DATA_ROOTS = [f"file://{tmp_path}"]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    hf = tiny_llama_hf()
    write_model_by_hand(
        open_store(f"file://{tmp_path / 'tiny-llama'}"),
        hf,
        random_weights(hf, seed=0),
        tokenizer_json=tiny_tokenizer_json(),
    )
    return tmp_path / "tiny-llama"


@pytest.fixture
def s3_dataset(s3_server: str, settings: Any) -> str:
    settings.OBJECT_STORE_ENDPOINT_URL = s3_server
    bucket = f"lineage-{time.monotonic_ns()}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    settings.TRAINING_DATA_ROOTS = [*settings.TRAINING_DATA_ROOTS, f"s3://{bucket}"]
    store = open_store(f"s3://{bucket}", endpoint_url=s3_server)
    store.put("stories/part-000.jsonl", jsonl(sentences(120, seed=1)))
    store.put("stories/part-001.jsonl", jsonl(sentences(120, seed=2)))
    return f"s3://{bucket}/stories"


def _healthy() -> None:
    for price in ("1.250000", "3.000000"):
        cluster = make_cluster(price=Decimal(price), accelerator_count=4, capacity=2)
        Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())


def _reached(run: TrainingRun) -> int:
    """The least advanced fragment's newest recorded version."""
    newest: dict[int, int] = {}
    for f, v in GlobalVersionRecord.objects.filter(run=run).values_list("fragment", "version"):
        newest[f] = max(v, newest.get(f, 0))
    return min(newest.values(), default=0)


def _train_until(run: TrainingRun, version: int, *, seq: int = 0) -> int:
    """Chunks on every learner, then a syncer tick, until every fragment reaches `version`."""
    for _ in range(12):
        for learner in TrainingLearner.objects.filter(run=run).order_by("index"):
            orchestrator.learner_chunk_execute(
                learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
            )
        seq += 1
        run.refresh_from_db()
        orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
        if _reached(run) >= version:
            return seq
    raise AssertionError(f"run {run.pk} did not reach version {version}: {_reached(run)}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 (loopback)
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (loopback)
        return dict(json.loads(answer.read()))


@pytest.mark.integration
def test_versions_register_every_k_a_run_continues_from_one_and_serve_model_answers_from_the_export(
    transactional_db: Any, tmp_path: Path, model_dir: Path, s3_dataset: str
) -> None:
    _healthy()
    config = tiny_run_config(
        model_uri=f"file://{model_dir}",
        model={"block_size": 16},
        dataset=s3_dataset,
        data={"format": "jsonl", "eval_every_nth_document": 5},
        register_every_versions=2,
    )
    run = services.training_run_create(config=config, created_by=None, name="lineage")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason

    _train_until(run, 4)
    reached = _reached(run)
    versions = list(ModelVersion.objects.filter(run=run).order_by("number"))
    assert [v.global_version for v in versions] == list(range(2, reached + 1, 2))
    assert [v.number for v in versions] == list(range(1, len(versions) + 1))
    first = versions[0]
    model = first.registered_model
    assert model.produced_by_run_id == run.pk and model.family == "llama"
    run.refresh_from_db()
    assert run.registered_model == model
    assert first.layout == ModelVersion.Layout.OPEN_WEIGHTS and not first.final
    assert first.artifact_uri == f"file://{tmp_path}/runs/{run.pk}/exports/v2"
    # Eval loss, tokens and cost are the run's own at version 2.
    at_2 = GlobalVersionRecord.objects.get(run=run, fragment=0, version=2)
    assert first.tokens == at_2.tokens_total > 0
    assert first.cost == at_2.cost_so_far and isinstance(first.cost, Decimal) and first.cost > 0
    engine = run_engine(run)
    transport = run_transport(run)
    params_2 = version_params(transport, engine.fragments, [2])
    assert first.eval_loss == pytest.approx(engine.evaluate(params_2))
    _, exported_2, _ = read_model_dir(open_store(first.artifact_uri))
    assert all(torch.equal(exported_2[n], params_2[n]) for n in params_2)

    # The syncer task runs again (a redelivered message, a restarted chain): nothing twice.
    assert model_versions_register_due(run=run, engine=engine, transport=transport) == []
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
    keys = list(ModelVersion.objects.filter(run=run).values_list("global_version", flat=True))
    assert sorted(keys) == list(range(2, _reached(run) + 1, 2))
    assert ModelVersion.objects.filter(run=run, global_version=2).get() == first

    # The final model: exported in the open-weights layout under the run's prefix, reloading
    # with identical parameters, with the run's tokenizer; the registered model points at it.
    run = services.training_run_succeed(run=run, why="test")
    final = ModelVersion.objects.get(run=run, final=True)
    newest, newest_versions, _ = newest_global(transport, engine.fragments)
    assert final.fragment_versions == newest_versions
    assert final.artifact_uri.startswith(f"file://{tmp_path}/runs/{run.pk}/exports/final-v")
    cfg, exported, from_checkpoint = read_model_dir(open_store(final.artifact_uri))
    assert from_checkpoint and cfg == engine.model_cfg
    assert set(exported) == set(newest) and all(torch.equal(exported[n], newest[n]) for n in newest)
    export_dir = Path(final.artifact_uri[len("file://") :])
    assert (export_dir / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    model.refresh_from_db()
    run.refresh_from_db()
    assert model.artifact_uri == final.artifact_uri == run.artifact_uri
    assert model.training_cost == final.cost and model.final_eval_loss == final.eval_loss
    assert services.training_run_succeed(run=run, why="again") == run  # no second final version
    assert ModelVersion.objects.filter(run=run, final=True).count() == 1

    # A second run continues from version 2: same data, and its version 0 is that version.
    child = services.training_run_create(
        config=tiny_run_config(
            model={},
            start_from={"model_version": str(first), "mode": "continue"},
            stop={"outer_steps": 2},
        ),
        created_by=None,
        name="continued",
    )
    assert child.started_from == first and child.config["dataset"] == s3_dataset
    assert child.config["model_uri"] == first.artifact_uri and child.config["model"]["block_size"] == 16
    services.training_run_place(run_id=child.pk)
    child.refresh_from_db()
    assert child.state == TrainingRun.State.RUNNING, child.reason
    child_engine = run_engine(child)
    start, _, _ = newest_global(run_transport(child), child_engine.fragments)
    assert all(torch.equal(start[n], params_2[n]) for n in params_2)
    assert list(first.runs_started.all()) == [child]

    # serve_model answers a chat request from the final export, through its tokenizer.
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(Path(django_settings.BASE_DIR) / "manage.py"), "serve_model"]
        + ["--model", model.slug, "--port", str(port)],
        env={**os.environ, "DATABASE_URL": session_database_url()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/models", timeout=1).read()  # noqa: S310 (loopback)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = process.stdout.read().decode() if process.stdout else ""
                    raise AssertionError(f"serve_model did not start: {output}") from None
                time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": "the cat sees"}], "max_tokens": 8}
        answer = _post_json(f"{base}/chat/completions", body)
    finally:
        stop_process(process, what="serve_model")
    reference = local_server_for_artifact(uri=final.artifact_uri, name="ref")
    try:
        generator = reference.generator
        pieces, prompt_tokens, finish = generator.generate("user: the cat sees\nassistant:", max_tokens=8)
        assert generator.tokenizer is not None
        prompt_ids = generator.tokenizer.encode("user: the cat sees\nassistant:")
    finally:
        reference.server_close()
    assert answer["object"] == "chat.completion" and answer["model"] == model.slug
    assert answer["choices"][0]["message"]["content"] == b"".join(pieces).decode("utf-8")
    assert answer["choices"][0]["finish_reason"] == finish
    # Tokens of the exported tokenizer, not bytes.
    assert (
        answer["usage"]["prompt_tokens"]
        == prompt_tokens
        == len(prompt_ids)
        < len(b"user: the cat sees\nassistant:")
    )


def test_an_unknown_or_mismatched_start_version_is_a_field_error(
    db: Any, tmp_path: Path, operator: Any
) -> None:
    def errors(start: Any, **extra: Any) -> dict[str, list[str]]:
        with pytest.raises(RunConfigError) as info:
            run_config_validate(tiny_run_config(start_from=start, **extra))
        return info.value.errors

    assert errors({"model_version": "nope@3"})["start_from.model_version"] == [
        "no model version 'nope@3': give <model slug>@<number> or a model version id"
    ]
    assert "start_from.model_version" in errors({"model_version": 999_999})
    assert errors({"model_version": "x@1", "mode": "resume"})["start_from.mode"] == [
        "must be one of continue, finetune"
    ]
    assert errors({"model_version": "x@1", "weights": 1})["start_from.weights"] == ["unknown field"]
    assert errors("x@1")["start_from"][0].startswith("must be an object")

    # Through the API: 400 with the field's message, and nothing created.
    client = APIClient()
    client.force_authenticate(operator)
    response = client.post(
        "/api/training-runs/",
        {"name": "child", "config": tiny_run_config(start_from={"model_version": "nope@1"})},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["start_from.model_version"][0].startswith("no model version 'nope@1'")
    assert not TrainingRun.objects.exists()


def _byte_run_with_version(tmp_path: Path) -> tuple[TrainingRun, ModelVersion]:
    """A byte-GPT run trained to version 1 and registered there (k = 1)."""
    _healthy()
    run = services.training_run_create(
        config=tiny_run_config(register_every_versions=1), created_by=None, name="bytes"
    )
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    _train_until(run, 1)
    version = ModelVersion.objects.filter(run=run).order_by("number").first()
    assert version is not None
    return run, version


def test_a_byte_model_version_fixes_the_architecture_and_a_finetune_starts_from_its_weights(
    db: Any, tmp_path: Path
) -> None:
    run, version = _byte_run_with_version(tmp_path)
    assert version.layout == ModelVersion.Layout.SWITCHYARD and version.global_version == 1
    assert version.artifact_uri.endswith(f"/runs/{run.pk}/artifacts/v1.syd")

    with pytest.raises(RunConfigError) as info:
        run_config_validate(
            tiny_run_config(
                model={"n_layer": 2, "n_embd": 16, "n_head": 2, "block_size": 16},
                start_from={"model_version": version.pk, "mode": "finetune"},
            )
        )
    assert info.value.errors == {"model.n_layer": ["must be 1 (start_from's model version)"]}
    with pytest.raises(RunConfigError) as info:
        run_config_validate(tiny_run_config(model_uri="file:///x", start_from={"model_version": version.pk}))
    assert info.value.errors["model_uri"] == ["start_from gives the model: leave model_uri empty"]

    # Fine-tuning (here on another sample of the data), with the version's weights and architecture.
    child = services.training_run_create(
        config=tiny_run_config(
            model={"dropout": 0.1},
            data={"max_train_bytes": 50_000, "max_eval_bytes": 5_000, "seed": 3},
            start_from={"model_version": version.pk, "mode": "finetune"},
        ),
        created_by=None,
        name="finetune",
    )
    assert child.started_from == version
    assert child.config["model"] == {**run.config["model"], "dropout": 0.1}
    assert child.config["start_from"]["mode"] == "finetune"
    services.training_run_place(run_id=child.pk)
    child.refresh_from_db()
    assert child.state == TrainingRun.State.RUNNING, child.reason
    start, _, _ = newest_global(run_transport(child), run_engine(child).fragments)
    weights = version_params(run_transport(run), run_engine(run).fragments, [1])
    assert set(start) == set(weights) and all(torch.equal(start[n], weights[n]) for n in weights)


def test_the_run_page_and_api_show_versions_with_cost_only_to_ledger_readers(
    db: Any, tmp_path: Path, client: Any, viewer: Any, auditor: Any
) -> None:
    run, version = _byte_run_with_version(tmp_path)
    cost = shown_text(version.cost)  # the page's money rule (billing.money)
    assert version.cost > 0

    client.force_login(auditor)
    page = client.get(f"/training/{run.pk}/").content.decode()
    assert "Model versions" in page and str(version) in page and cost in page
    client.force_login(viewer)
    page = client.get(f"/training/{run.pk}/").content.decode()
    assert str(version) in page and "Cost so far</th>" not in page

    api = APIClient()
    for user, shown in ((viewer, None), (auditor, str(version.cost))):
        api.force_authenticate(user)
        body = api.get(f"/api/training-runs/{run.pk}/").json()
        (row,) = [v for v in body["model_versions"] if v["id"] == version.pk]
        assert row["ref"] == str(version) and row["tokens"] == version.tokens
        assert row["eval_loss"] == version.eval_loss and row["layout"] == "switchyard"
        # A viewer's answer has no money key at all (registry.auth.costs).
        assert ("cost" not in row) if shown is None else Decimal(row["cost"]) == version.cost
    assert RegisteredModel.objects.get(pk=version.registered_model_id).artifact_uri == version.artifact_uri
