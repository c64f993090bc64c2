"""A learner replica as it crosses to a helper rank: what rank 0 sends (``replica_blob``) and
what the helper builds from it (``helper_learner``, with its sampler from ``sampler_from_spec``).

The blob is a storage.tensorblob (JSON header and tensors, no pickle): the model config, the
inner config, the parameters, the AdamW state and schedule position, and the recipe of the
rank's sampler (its shard and its saved position). Rank 0 (training.engine.distributed.leader)
sends it when a session starts a replica; the helper (training.engine.distributed.helper) reads it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from storage.objectstore import ObjectStore
from storage.tensorblob import pack, unpack
from training.engine.config import InnerConfig
from training.engine.data import BatchSampler, Sampler
from training.engine.learner import Learner
from training.engine.model import AnyModelConfig, make_model, model_config_from_dict, model_config_to_dict

SamplerSpec = tuple[dict[str, Any], dict[str, torch.Tensor]]


def replica_blob(learner: Learner, *, rank: int, sampler: SamplerSpec, shapes_only: bool = False) -> bytes:
    """Everything helper ``rank`` needs: model and inner config, parameters, AdamW state, the
    schedule position, and its sampler's recipe (and saved position, if the learner has one).

    ``shapes_only`` (a sharded group): no parameters and no AdamW state; the helper builds the
    model's shapes and takes its shards from rank 0 as the session starts (sharding.shard)."""
    meta, tensors = learner.state_dict()
    wanted = () if shapes_only else ("param:", "opt:")
    keep = {k: t for k, t in tensors.items() if wanted and k.startswith(wanted)}
    if shapes_only:
        meta = {**meta, "opt_keys": {}}
    sampler_meta, sampler_tensors = sampler
    keep.update({f"sampler_spec:{k}": t for k, t in sampler_tensors.items()})
    saved = learner.rank_samplers.get(rank)
    if saved is not None:
        keep["sampler"] = saved
    inner = asdict(learner.inner)
    header = {
        "model": model_config_to_dict(learner.model_cfg),
        "inner": inner,
        "fragments": learner.fragments,
        "learner": {k: meta[k] for k in ("learner", "step_count", "opt_keys")},
        "ranks": learner.ranks,
        "sampler": sampler_meta,
        "skip": learner.rank_skip,  # windows a dead chunk pushed (Learner.skip_windows)
    }
    return pack(header, keep)


def sampler_from_spec(
    meta: dict[str, Any], tensors: dict[str, torch.Tensor], *, store: ObjectStore | None = None
) -> Sampler:
    """A rank's sampler from its recipe (training.run_engines.sampler_spec writes it): the byte
    corpus shard and seed, or a text dataset's shard (read from ``store``, or the store at the
    recipe's URL)."""
    if meta["kind"] == "bytes":
        return BatchSampler(
            tensors["data"], block_size=meta["block_size"], batch_size=meta["batch_size"], seed=meta["seed"]
        )
    from storage.objectstore import open_store
    from training.engine.stream import DatasetManifest, TextDataset, TokenStream
    from training.engine.tokenizer import ByteTokenizer, JsonTokenizer, Tokenizer

    if store is None:
        store = open_store(meta["store_url"], endpoint_url=meta.get("endpoint_url"))
    tokenizer: Tokenizer = ByteTokenizer()
    if "tokenizer_json" in tensors:
        tokenizer = JsonTokenizer(bytes(tensors["tokenizer_json"].tolist()), eos_id=meta.get("eos_id"))
    dataset = TextDataset(
        keys=tuple(meta["keys"]),
        format=meta["format"],
        text_field=meta["text_field"],
        eval_every_nth=meta["eval_every_nth"],
    )
    stream = TokenStream(
        store,
        dataset,
        tokenizer,
        block_size=meta["block_size"],
        batch_size=meta["batch_size"],
        shard=meta["shard"],
        shards=meta["shards"],
        manifest=DatasetManifest.from_dict(meta["manifest"]) if meta.get("manifest") else None,
    )
    if meta.get("skip"):
        stream.skip(int(meta["skip"]))
    return stream


def helper_learner(blob: bytes, device: torch.device) -> Learner:
    """Rank r's replica from what rank 0 sent it (training.engine.distributed.replica_blob)."""
    header, tensors = unpack(blob)
    inner = dict(header["inner"])
    inner["betas"] = tuple(inner["betas"])
    spec = {k[len("sampler_spec:") :]: t for k, t in tensors.items() if k.startswith("sampler_spec:")}
    sampler = sampler_from_spec(header["sampler"], spec)
    model_cfg: AnyModelConfig = model_config_from_dict(header["model"])
    init = {k[len("param:") :]: t for k, t in tensors.items() if k.startswith("param:")}
    if not init:  # a sharded group's replica: shapes only, its values come as shards
        init = {n: p.detach() for n, p in make_model(model_cfg).named_parameters()}
    learner = Learner(
        learner_id=int(header["learner"]["learner"]),
        model_cfg=model_cfg,
        inner=InnerConfig(**inner),
        fragments=header["fragments"],
        sampler=sampler,
        init=init,
        device=device,
        ranks=int(header["ranks"]),
    )
    learner.load_replica(header["learner"], tensors)
    learner.skip_windows(int(header.get("skip", 0)))
    return learner
