"""Issue 16's "done when", end to end on real processes: a brought model from start to serving.

A tiny Llama in the open-weights layout, with a BPE tokenizer.json the test trains itself, is
written to S3 (moto's server on loopback) next to a JSONL dataset; both lie under
SWITCHYARD_TRAINING_DATA_ROOTS. A run with learners of 2 gloo ranks trains on two clusters,
each served by its own `manage.py worker --cluster` process (the control worker syncs, beat
supervises). One cluster's worker is SIGKILLed mid-run: its learner moves to the other cluster
and continues from the dead worker's last checkpoint with its AdamW state (the step counts go
on from there, not from zero). Versions are registered as it goes; a second run continues from
one of them; its final model is exported in the open-weights layout and a real `serve_model`
process answers a chat completion from it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from django.conf import settings as django_settings
from django.db import close_old_connections

from inference.serving.local import local_server_for_artifact
from registry.models import Cluster, FailoverEvent
from storage.objectstore import open_store
from tests.factories import make_cluster, tiny_run_config
from tests.integration.processes import Processes, session_database_url, stop_process, wait_until
from tests.training.engine.tiny_open_weights import (
    jsonl,
    random_weights,
    sentences,
    tiny_llama_hf,
    tiny_tokenizer_json,
    write_model_by_hand,
)
from training.engine.openweights import read_model_dir
from training.models import LearnerChunk, ModelVersion, TrainingLearner, TrainingRun
from training.run_engines import run_checkpoints, run_engine, run_transport, version_params
from training.services import training_run_create

# One of the suite's trainers, which one pytest-xdist worker runs one after another
# (tests/xdist_workers.py, SERIAL_GROUPS).
pytestmark = pytest.mark.integration

FAST = {"SWITCHYARD_TRAINING_SUPERVISE_SECONDS": "1"}


@pytest.fixture
def s3_inputs(
    s3_server: str, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str]:
    """(model_uri, dataset): the tiny Llama and two JSONL files in a fresh bucket, which every
    process of the test (this one and the workers it starts) may read; runs keep their tensors
    in tmp_path/objects, the installation's store."""
    bucket = f"e2e-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    hf = tiny_llama_hf()
    write_model_by_hand(
        open_store(f"s3://{bucket}/tiny-llama", endpoint_url=s3_server),
        hf,
        random_weights(hf, seed=0),
        tokenizer_json=tiny_tokenizer_json(),
    )
    data = open_store(f"s3://{bucket}", endpoint_url=s3_server)
    data.put("stories/part-000.jsonl", jsonl(sentences(120, seed=1)))
    data.put("stories/part-001.jsonl", jsonl(sentences(120, seed=2)))
    objects = f"file://{tmp_path / 'objects'}"
    for name, value in (
        ("OBJECT_STORE_URL", objects),
        ("OBJECT_STORE_ENDPOINT_URL", s3_server),
        ("TRAINING_DATA_ROOTS", [f"s3://{bucket}"]),
    ):
        setattr(settings, name, value)
    monkeypatch.setenv("OBJECT_STORE_URL", objects)
    monkeypatch.setenv("OBJECT_STORE_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("SWITCHYARD_TRAINING_DATA_ROOTS", f"s3://{bucket}")
    return f"s3://{bucket}/tiny-llama", f"s3://{bucket}/stories"


def _config(**over: Any) -> dict[str, Any]:
    """Quorum 2 of 2: no version is merged without the killed learner, so the run can only end
    once that learner trains again from its checkpoint. chunk_seconds is training time (the
    rank start comes on top). A version needs a syncer tick (about half a second apart), so the
    first chunk on the cheap cluster ends, and checkpoints, well before version 14.
    """
    return tiny_run_config(
        learners={"count": 2, "quorum": 2, "batch_size": 4, "ranks": 2},
        h=5,
        inner={"lr": 3e-3, "warmup_steps": 5},
        syncer={"grace_seconds": 0.5},
        chunk_seconds=4.0,
        learner_timeout=60.0,
        register_every_versions=4,
        **over,
    )


def _run(pk: int) -> TrainingRun:
    close_old_connections()
    return TrainingRun.objects.get(pk=pk)


def _finished(pk: int) -> TrainingRun | None:
    run = _run(pk)
    return run if run.is_finished else None


def _logs(processes: Processes, *names: str) -> str:
    return "\n".join(f"--- {n}\n{processes.log(n)[-4000:]}" for n in names)


def _adam_steps(tensors: dict[str, torch.Tensor]) -> set[int]:
    """Every parameter's AdamW step counter in a learner checkpoint."""
    return {int(t.item()) for k, t in tensors.items() if k.startswith("opt:step:")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chat(model_slug: str, content: str) -> dict[str, Any]:
    """Start `manage.py serve_model` on a free loopback port, POST one chat completion, stop it."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(Path(django_settings.BASE_DIR) / "manage.py"), "serve_model"]
        + ["--model", model_slug, "--port", str(port)],
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
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
        request = urllib.request.Request(  # noqa: S310 (loopback)
            f"{base}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (loopback)
            return dict(json.loads(answer.read()))
    finally:
        stop_process(process, what="serve_model")


def test_a_brought_llama_trains_on_two_clusters_of_two_ranks_survives_a_kill_resumes_and_serves(
    processes: Processes, s3_inputs: tuple[str, str]
) -> None:
    model_uri, dataset = s3_inputs
    # 4 accelerators in 2 learner slots each: a slot holds the 2 devices a learner's 2 ranks use.
    cheap = make_cluster(price=Decimal("1.000000"), accelerator_count=4, capacity=2)
    dear = make_cluster(price=Decimal("2.500000"), accelerator_count=4, capacity=2)
    processes.start("control", "worker", "--control", "--loglevel", "info", env=FAST)
    processes.start("beat", "beat", "--loglevel", "warning", env=FAST)
    processes.start(cheap.slug, "worker", "--cluster", cheap.slug, "--loglevel", "info", env=FAST)
    # Two worker processes on the cluster that survives: after the kill it runs both learners
    # at once (quorum 2 needs both), as a second worker of the cluster would.
    processes.start(
        dear.slug, "worker", "--cluster", dear.slug, "--concurrency", "2", "--loglevel", "info", env=FAST
    )

    def healthy() -> bool:
        close_old_connections()
        return Cluster.objects.filter(pk__in=[cheap.pk, dear.pk], status="healthy").count() == 2

    wait_until(healthy, timeout=120, what="cluster workers' first heartbeats")

    data = {"format": "jsonl", "eval_every_nth_document": 5}
    config = _config(
        model_uri=model_uri, model={"block_size": 16}, dataset=dataset, data=data, stop={"outer_steps": 14}
    )
    run = training_run_create(config=config, created_by=None, name="e2e-byo")
    assert run.state != TrainingRun.State.FAILED, run.reason

    def a_chunk_on_cheap() -> bool:
        close_old_connections()
        return LearnerChunk.objects.filter(
            learner__run_id=run.pk, cluster=cheap, finished_at__isnull=False, steps__gt=0
        ).exists()

    wait_until(
        a_chunk_on_cheap, timeout=240, what="chunks on the cheap cluster\n" + _logs(processes, cheap.slug)
    )
    assert not _run(run.pk).is_finished
    processes.kill(cheap.slug)  # the worker and its rank-1 helper: one process group
    # The dead worker's newest checkpoint: the one its learner must continue from.
    checkpoints = run_checkpoints(run)
    generation, chunk = max(checkpoints.list(0))
    assert generation == 0
    meta, tensors = checkpoints.read(0, generation, chunk)
    steps_at_kill = meta["learner"]["step_count"]
    assert steps_at_kill > 0 and _adam_steps(tensors) == {steps_at_kill}
    assert any(t.abs().sum() > 0 for k, t in tensors.items() if k.startswith("opt:exp_avg_sq:"))
    assert "sampler@1" in tensors  # rank 1's data position travels with the checkpoint

    done = wait_until(
        lambda: _finished(run.pk),
        timeout=300,
        what="the run to end after the kill\n" + _logs(processes, "control", dear.slug),
    )
    assert done.state == TrainingRun.State.SUCCEEDED, done.reason
    # Learner 0 failed over from the killed cluster to the survivor. Learner 1 may have been on
    # the cheap cluster too (both fit there), then it moved with its own event, the same way.
    events = list(FailoverEvent.objects.filter(training_run_id=done.pk))
    assert 1 <= len(events) <= 2
    assert all(e.from_cluster_id == cheap.pk and e.to_cluster_id == dear.pk for e in events), events
    learner = TrainingLearner.objects.get(run=done, index=0)
    assert learner.generation == 1 and learner.cluster_id == dear.pk
    # The re-placed learner loaded that checkpoint: weights, AdamW moments and step counters.
    restart = LearnerChunk.objects.get(learner=learner, generation=1, seq=0)
    assert restart.state_source == LearnerChunk.StateSource.CHECKPOINT
    assert restart.checkpoint_key == checkpoints.key(0, generation, chunk)
    assert restart.accelerators == 2
    # Its newest checkpoint counts on from the step it was killed at, not from zero.
    later = max(k for k in checkpoints.list(0) if k[0] == 1)
    meta, tensors = checkpoints.read(0, *later)

    def recorded() -> bool:
        # A chunk writes its checkpoint, then records itself finished with its last steps: the
        # run can end in between, so wait for the record before summing the steps.
        close_old_connections()
        return LearnerChunk.objects.filter(
            learner=learner, generation=1, seq=later[1], finished_at__isnull=False
        ).exists()

    wait_until(recorded, timeout=60, what="the checkpointed chunk's record")
    trained_since = sum(
        LearnerChunk.objects.filter(learner=learner, generation=1, seq__lte=later[1]).values_list(
            "steps", flat=True
        )
    )
    assert trained_since > 0
    assert meta["learner"]["step_count"] == steps_at_kill + trained_since
    assert _adam_steps(tensors) == {steps_at_kill + trained_since}
    assert done.final_eval_loss is not None and done.initial_eval_loss is not None
    assert done.final_eval_loss < done.initial_eval_loss

    # Every 4th global version was registered, and the final model with them.
    versions = list(ModelVersion.objects.filter(run=done).order_by("number"))
    middle = [v for v in versions if not v.final]
    assert middle and all(v.global_version % 4 == 0 for v in middle)
    assert [v.final for v in versions].count(True) == 1
    source = middle[-1]
    assert source.layout == ModelVersion.Layout.OPEN_WEIGHTS

    # A second run continues from a registered version: its version 0 is that version.
    child = training_run_create(
        config=_config(
            model={},
            start_from={"model_version": str(source), "mode": "continue"},
            stop={"outer_steps": 2},
        ),
        created_by=None,
        name="e2e-continued",
    )
    assert child.started_from == source and child.config["dataset"] == dataset
    child = wait_until(
        lambda: _finished(child.pk),
        timeout=240,
        what="the continued run to end\n" + _logs(processes, "control", dear.slug),
    )
    assert child.state == TrainingRun.State.SUCCEEDED, child.reason
    _, source_params, _ = read_model_dir(open_store(source.artifact_uri))
    fragments = run_engine(child).fragments
    start = version_params(run_transport(child), fragments, [0] * len(fragments))
    assert set(start) == set(source_params)
    assert all(torch.equal(start[n], source_params[n]) for n in start)

    # Its final model is an open-weights directory (config.json, model.safetensors, tokenizer.json)
    # that serve_model answers from, through the exported tokenizer.
    final = ModelVersion.objects.get(run=child, final=True)
    cfg, exported, from_checkpoint = read_model_dir(open_store(final.artifact_uri))
    assert from_checkpoint and type(cfg).__name__ == "LlamaConfig" and set(exported) == set(source_params)
    export_dir = Path(final.artifact_uri[len("file://") :])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in export_dir.iterdir()}
    assert child.registered_model is not None
    assert child.registered_model.artifact_uri == final.artifact_uri
    answer = _chat(child.registered_model.slug, "the cat sees")
    reference = local_server_for_artifact(uri=final.artifact_uri, name="ref")
    try:
        pieces, prompt_tokens, finish = reference.generator.generate(
            "user: the cat sees\nassistant:", max_tokens=8
        )
    finally:
        reference.server_close()
    assert answer["object"] == "chat.completion" and answer["model"] == child.registered_model.slug
    assert answer["choices"][0]["message"]["content"] == b"".join(pieces).decode("utf-8")
    assert answer["choices"][0]["finish_reason"] == finish
    # Tokens of the brought tokenizer, not bytes.
    assert answer["usage"]["prompt_tokens"] == prompt_tokens < len(b"user: the cat sees\nassistant:")
