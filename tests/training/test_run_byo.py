"""Runs of a brought model: a tiny Llama with its tokenizer on a JSONL dataset in S3 (moto).

Config validation names every bad field; a placed run trains chunks of the brought model on its
shard of the streamed dataset, the syncer publishes and evaluates versions, and the newest
global parameters export in the open-weights layout they came in.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from django.utils import timezone

from registry.models import Cluster
from storage.objectstore import open_store
from tests.factories import make_cluster, tiny_run_config
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
from training.engine.shards import DatasetManifest
from training.models import GlobalVersionRecord, LearnerChunk, TrainingLearner, TrainingRun
from training.run_config import (
    DATASET_REFUSED,
    OBJECT_REFUSED,
    RunConfig,
    RunConfigError,
    run_config_validate,
)
from training.run_engines import export_open_weights, newest_global, run_engine, run_transport


@pytest.fixture(autouse=True)
def _data_roots(tmp_path: Path, settings: Any) -> None:
    """What an admin would list: this test's directory and the buckets the tests read."""
    settings.TRAINING_DATA_ROOTS = [
        f"file://{tmp_path}",
        "s3://corpora",
        "s3://byo-run-data",
        "s3://bucket-only",
    ]


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


def _errors(raw: Any) -> dict[str, list[str]]:
    with pytest.raises(RunConfigError) as info:
        run_config_validate(raw)
    return info.value.errors


def test_a_brought_model_config_is_normalised_and_read_back(model_dir: Path) -> None:
    cfg = run_config_validate(
        {
            "model_uri": f"file://{model_dir}",
            "model": {"block_size": 32},
            "dataset": "s3://corpora/stories/",
            "data": {"format": "jsonl", "text_field": "body"},
            "stop": {"outer_steps": 3},
        }
    )
    rc = RunConfig(cfg)
    assert rc.model_uri == f"file://{model_dir}" and rc.tokenizer_uri is None
    assert (rc.data_format, rc.text_field, rc.block_size) == ("jsonl", "body", 32)
    # A config stored before these fields existed reads as the byte-level default.
    old = {k: v for k, v in cfg.items() if k not in ("model_uri", "tokenizer_uri")}
    old["data"] = {k: v for k, v in cfg["data"].items() if k not in ("format", "text_field")}
    assert RunConfig(old).model_uri is None and RunConfig(old).data_format == "bytes"


def test_bad_model_tokenizer_and_dataset_uris_are_field_errors(tmp_path: Path, model_dir: Path) -> None:
    errors = _errors(
        {
            "model_uri": f"file://{tmp_path}",
            "tokenizer_uri": "s3://bucket-only",
            "dataset": "s3://",
            "data": {"format": "jsonl", "text_field": ""},
            "stop": {"outer_steps": 3},
        }
    )
    assert errors["model_uri"] == [f"file://{tmp_path} holds no config.json"]
    assert errors["tokenizer_uri"] == ["s3:// URI names no object"]
    assert errors["dataset"] == [DATASET_REFUSED]
    assert errors["data.text_field"] == ["must be a field or column name (1 to 128 characters)"]
    assert _errors({"model_uri": "http://example.invalid/m", "stop": {"outer_steps": 3}})["model_uri"] == [
        OBJECT_REFUSED
    ]


def test_model_and_tokenizer_uris_outside_the_roots_get_one_answer_whether_or_not_they_exist(
    tmp_path: Path, model_dir: Path, settings: Any
) -> None:
    settings.TRAINING_DATA_ROOTS = [f"file://{tmp_path / 'data-only'}"]
    for uri in (
        f"file://{model_dir}",
        "file:///etc",
        "file:///no/such/dir",
        f"file://{tmp_path}/../x",
        "s3://corpora",
    ):
        errors = _errors(
            {
                "model_uri": uri,
                "tokenizer_uri": uri,
                "dataset": uri,
                "data": {"format": "jsonl"},
                "stop": {"outer_steps": 3},
            }
        )
        assert errors["model_uri"] == [OBJECT_REFUSED], uri
        assert errors["tokenizer_uri"] == [OBJECT_REFUSED], uri
        assert errors["dataset"] == [DATASET_REFUSED], uri


def test_a_brought_model_needs_text_and_takes_its_shape_from_config_json(model_dir: Path) -> None:
    errors = _errors(
        {
            "model_uri": f"file://{model_dir}",
            "model": {"n_layer": 4, "n_head": 2, "block_size": 32},
            "stop": {"outer_steps": 3},
        }
    )
    assert errors["model.n_layer"] == ["comes from model_uri's config.json (only block_size may be given)"]
    assert "model.n_head" in errors and "model.block_size" not in errors
    assert errors["data.format"] == ["a model_uri or tokenizer_uri needs text: use text, jsonl or parquet"]
    stdlib = _errors({"data": {"format": "text"}, "stop": {"outer_steps": 3}})
    assert stdlib["data.format"] == [
        "text reads the dataset's files; stdlib:// is the byte corpus (format bytes)"
    ]
    assert (
        "must be one of" in _errors({"data": {"format": "csv"}, "stop": {"outer_steps": 3}})["data.format"][0]
    )


def _healthy() -> None:
    for price in ("1.250000", "3.000000"):
        cluster = make_cluster(price=Decimal(price), accelerator_count=4, capacity=2)
        Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())


@pytest.fixture
def s3_dataset(s3_server: str, settings: Any) -> str:
    settings.OBJECT_STORE_ENDPOINT_URL = s3_server
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="byo-run-data")
    store = open_store("s3://byo-run-data", endpoint_url=s3_server)
    store.put("stories/part-000.jsonl", jsonl(sentences(150, seed=1)))
    store.put("stories/part-001.jsonl", jsonl(sentences(150, seed=2)))
    return "s3://byo-run-data/stories"


def _byo_run(tmp_path: Path, model_uri: str, dataset: str) -> TrainingRun:
    _healthy()
    config = tiny_run_config(
        model_uri=model_uri,
        model={"block_size": 16},
        dataset=dataset,
        data={"format": "jsonl", "eval_every_nth_document": 5},
    )
    run = services.training_run_create(config=config, created_by=None, name="byo")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    return run


def test_a_placed_run_trains_the_brought_llama_on_its_s3_shard_and_exports_it(
    db: Any, tmp_path: Path, model_dir: Path, s3_dataset: str
) -> None:
    run = _byo_run(tmp_path, f"file://{model_dir}", s3_dataset)
    assert run.state == TrainingRun.State.RUNNING, run.reason
    engine = run_engine(run)
    assert type(engine.model_cfg).__name__ == "LlamaConfig"
    assert engine.text is not None and engine.text.keys == (
        "stories/part-000.jsonl",
        "stories/part-001.jsonl",
    )
    assert engine.tokenizer is not None and engine.tokenizer.eos_id == 0  # from config.json
    # The dataset's split into learners x ranks shards is stored with the run's objects, and it
    # is the one the engine (and so every learner's sampler recipe) uses.
    stored = open_store(f"file://{tmp_path}").get(f"runs/{run.pk}/dataset/manifest.json")
    assert engine.manifest is not None and DatasetManifest.from_json(stored) == engine.manifest
    assert engine.manifest.shards == engine.rc.learners * engine.rc.ranks
    assert engine.manifest.keys == engine.text.keys and len(engine.manifest.sizes) == 2
    assert run.initial_eval_loss is not None
    # Version 0 is the checkpoint's weights, not a fresh initialisation.
    _, checkpoint, _ = read_model_dir(open_store(f"file://{model_dir}"))
    params, _, _ = newest_global(run_transport(run), engine.fragments)
    assert all(torch.equal(params[n], checkpoint[n]) for n in checkpoint)

    for learner in TrainingLearner.objects.filter(run=run).order_by("index"):
        orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    for chunk in LearnerChunk.objects.filter(learner__run=run):
        assert chunk.error == "" and chunk.steps > 0
        assert chunk.tokens == chunk.steps * 4 * 16  # batch 4 of 16-token windows
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
    services.versions_evaluate(run_id=run.pk)  # the evaluator, on a cluster's queue in a worker
    v1 = GlobalVersionRecord.objects.get(run=run, fragment=0, version=1)
    assert v1.eval_loss is not None and v1.tokens_merged > 0

    url, versions = export_open_weights(run, name="latest")
    assert url == f"file://{tmp_path}/runs/{run.pk}/exports/latest" and versions == [1]
    cfg, exported, from_checkpoint = read_model_dir(open_store(url))
    newest, _, _ = newest_global(run_transport(run), engine.fragments)
    assert from_checkpoint and cfg == engine.model_cfg
    assert all(torch.equal(exported[n], newest[n]) for n in newest)
    assert (tmp_path / "runs" / str(run.pk) / "exports" / "latest" / "tokenizer.json").read_bytes() == (
        model_dir / "tokenizer.json"
    ).read_bytes()

    run = services.training_run_succeed(run=run, why="test")
    assert run.registered_model is not None
    assert (run.registered_model.family, run.registered_model.tokenizer) == ("llama", "tokenizer.json")
    # The final model is its open-weights export (training.services.lineage).
    final_cfg, _, _ = read_model_dir(open_store(run.artifact_uri))
    assert final_cfg == engine.model_cfg and run.registered_model.artifact_uri == run.artifact_uri


def test_a_brought_model_that_cannot_be_read_fails_the_run_saying_why(
    db: Any, tmp_path: Path, s3_dataset: str
) -> None:
    run = _byo_run(tmp_path, "s3://byo-run-data/no-model-here", s3_dataset)
    assert run.state == TrainingRun.State.FAILED
    assert "no config.json" in run.reason
