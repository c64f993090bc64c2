from __future__ import annotations

import dataclasses

import pytest
import torch

from storage.artifacts import ArtifactError, model_artifact_read, model_artifact_write
from training.engine.config import ModelConfig
from training.engine.model import build_model, model_from_artifact


def test_an_artifact_round_trips_config_and_parameters(tmp_path):
    cfg = ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=16)
    model = build_model(cfg, seed=3)
    uri = model_artifact_write(
        store_url=f"file://{tmp_path}",
        key="runs/7/model.bin",
        model_config=dataclasses.asdict(cfg),
        params=dict(model.state_dict()),
        meta={"training_run_id": 7},
    )
    assert uri == f"file://{tmp_path}/runs/7/model.bin"

    read_cfg, params, meta = model_artifact_read(uri=uri)
    assert ModelConfig(**read_cfg) == cfg
    assert meta["training_run_id"] == 7
    for name, tensor in model.state_dict().items():
        assert torch.equal(params[name], tensor), name

    loaded, _ = model_from_artifact(uri=uri)
    x = torch.randint(0, 256, (1, 8))
    assert torch.equal(loaded(x), model.eval()(x))


def test_reading_a_missing_or_foreign_object_names_the_uri(tmp_path):
    with pytest.raises(ArtifactError, match="no artifact at"):
        model_artifact_read(uri=f"file://{tmp_path}/missing.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a model")
    with pytest.raises(ArtifactError, match="not a model artifact"):
        model_artifact_read(uri=f"file://{tmp_path}/junk.bin")
    with pytest.raises(ArtifactError, match="must start with"):
        model_artifact_read(uri="http://example/model.bin")
