"""DiLoCo on a brought model: a tiny Llama with its own tokenizer, two learners on a JSONL dataset."""

from __future__ import annotations

import torch

from storage.objectstore import open_store
from tests.training.engine.tiny_open_weights import (
    jsonl,
    sentences,
    tiny_llama_hf,
    tiny_tokenizer_json,
    write_model_by_hand,
)
from training.engine.config import CompressionConfig, InnerConfig, OuterConfig, SyncerConfig
from training.engine.data import evaluate
from training.engine.fragments import assign_fragments
from training.engine.learner import Learner
from training.engine.model import load_params, make_model
from training.engine.openweights import read_model_dir, write_model_dir
from training.engine.stream import TextDataset, TokenStream, dataset_keys, eval_batches
from training.engine.syncer import Syncer
from training.engine.tokenizer import JsonTokenizer, eos_from_config
from training.engine.transport import InMemoryTransport


def test_two_learners_train_a_tiny_llama_with_diloco_and_the_export_reloads(tmp_path):
    models = open_store(f"file://{tmp_path / 'models'}")
    write_model_by_hand(models, tiny_llama_hf(), None, tokenizer_json=tiny_tokenizer_json())
    cfg, init, _ = read_model_dir(models, seed=0)
    tokenizer = JsonTokenizer(models.get("tokenizer.json"), eos_id=eos_from_config(cfg.extra))
    data = open_store(f"file://{tmp_path / 'data'}")
    data.put("train/a.jsonl", jsonl(sentences(120, seed=5)))
    data.put("train/b.jsonl", jsonl(sentences(120, seed=6)))
    ds = TextDataset(keys=dataset_keys(data, "train", "jsonl"), format="jsonl", eval_every_nth=8)
    evals = eval_batches(data, ds, tokenizer, block_size=24, windows=32)

    fragments = assign_fragments(init, fragments=1)
    transport = InMemoryTransport()
    syncer = Syncer(
        cfg=SyncerConfig(learners=2), outer=OuterConfig(), fragments=fragments, init=init, transport=transport
    )
    inner = InnerConfig(lr=1e-2, warmup_steps=2, total_steps=40, batch_size=8)
    learners = [
        Learner(
            learner_id=i,
            model_cfg=cfg,
            inner=inner,
            fragments=fragments,
            sampler=TokenStream(data, ds, tokenizer, block_size=24, batch_size=8, shard=i, shards=2),
            init=init,
            compression=CompressionConfig(kind="int8"),
            device="cpu",
        )
        for i in range(2)
    ]
    before = evaluate(load_params(make_model(cfg), init), evals)
    for _ in range(8):  # 8 outer steps of H = 5
        for learner in learners:
            learner.train(5)
            transport.put_delta(learner.make_delta(0))
        syncer.pull(now=0.0)
        (version,) = syncer.poll(now=0.0)
        for learner in learners:
            learner.adopt(0, version.params, version.version)
    after = evaluate(load_params(make_model(cfg), syncer.params), evals)
    assert syncer.version == [8]
    assert after < before - 1.0, (before, after)

    out = open_store(f"file://{tmp_path / 'export'}")
    write_model_dir(out, cfg=cfg, params=syncer.params, tokenizer_json=tokenizer.data)
    again_cfg, again, from_checkpoint = read_model_dir(out)
    assert from_checkpoint and again_cfg == cfg
    assert evaluate(load_params(make_model(again_cfg), again), evals) == after
    assert torch.equal(again["model.embed_tokens.weight"], syncer.params["model.embed_tokens.weight"])
