"""A run's engine objects in this process (built from its config, cached), version 0 and artifacts.

The engine (training/engine) is used as is. What every process of a run derives from its config
(fragments, corpus, eval batches, the initial parameters) is built once per worker process and
kept in `_ENGINES`; training.services publishes version 0 and writes artifacts through here, and
training.orchestrator's chunk and syncer loops build on it. No database writes happen here.

The engine modules import torch at the top, so they are imported inside the functions that use
them: the web process imports this module (through training.services) without loading torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from registry.models import Cluster
from registry.store.cluster_stores import cluster_store
from registry.store.objectstore import configured_store
from storage.artifacts import model_artifact_read, model_artifact_write
from storage.objectstore import ObjectStore, open_store
from training.models import TrainingRun
from training.run_config import (
    OBJECT_REFUSED,
    DatasetSource,
    RunConfig,
    dataset_keys,
    dataset_source,
    model_roots,
)

if TYPE_CHECKING:
    import torch

    from training.engine.checkpoint import CheckpointStore
    from training.engine.data import Corpus, Sampler
    from training.engine.model import AnyModelConfig
    from training.engine.stream import DatasetManifest, TextDataset
    from training.engine.tokenizer import Tokenizer
    from training.engine.transport import ObjectStoreTransport


def torch_threads_limit() -> None:
    """One intra-op torch thread in this process (see the comment inside)."""
    import torch  # lazily: the web process never loads torch

    # One intra-op thread per worker process: the cluster workers, the control worker and the
    # web process share this machine's cores, and oversubscribed BLAS threads slow all of them.
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def warm_up() -> None:
    """Import the engine (and torch) in this process; called when a worker starts."""
    # Lazily, on purpose: this is the import that workers pay up front and the web never pays.
    import training.engine.data
    import training.engine.learner
    import training.engine.syncer
    import training.engine.transport  # noqa: F401

    torch_threads_limit()


def run_transport(run: TrainingRun) -> ObjectStoreTransport:
    """The run's deltas and versions in its object store (`runs/<id>/` of object_store_url)."""
    from training.engine.transport import ObjectStoreTransport  # lazily: imports torch

    rc = RunConfig(run.config)
    store = configured_store(rc.object_store_url)
    return ObjectStoreTransport(store, prefix=f"runs/{run.pk}")


def _source(uri: str, *, model: bool = False) -> DatasetSource:
    """The checked location of a URI a run reads, judged again against the training data roots
    here, where it is read: the roots may have narrowed, or a symlink moved, since validation."""
    found = dataset_source(uri, roots=model_roots() if model else None)
    if found is None or found.kind == "stdlib":
        raise ValueError(f"{uri}: {OBJECT_REFUSED}")
    return found


def object_location(uri: str, *, model: bool = False) -> tuple[ObjectStore, str]:
    """The store holding the object or folder a run config names, and its key there.

    ``s3://bucket/a/b`` is key ``a/b`` of the bucket; ``file:///x/y`` is key ``y`` of the
    directory ``/x`` (after resolving symlinks).
    """
    found = _source(uri, model=model)
    if found.kind == "objects":
        return configured_store(f"s3://{found.bucket}"), found.prefix
    assert found.path is not None  # noqa: S101 (kind == "files")
    return open_store(f"file://{found.path.parent}"), found.path.name


def model_store(uri: str) -> ObjectStore:
    """The store rooted at a model directory (config.json is key ``config.json`` there)."""
    found = _source(uri, model=True)
    if found.kind == "objects":
        return configured_store(f"s3://{found.bucket}/{found.prefix}")
    return open_store(f"file://{found.path}")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def run_checkpoints(run: TrainingRun, cluster: Cluster | None = None) -> CheckpointStore:
    """The run's learner checkpoints kept by `cluster`'s learners (`runs/<id>/learners/`): in the
    cluster's own store when it has one (registry.store.cluster_stores), else in the run's."""
    from training.engine.checkpoint import CheckpointStore  # lazily: imports torch

    store = cluster_store(cluster) if cluster is not None else None
    if store is None:
        store = configured_store(RunConfig(run.config).object_store_url)
    return CheckpointStore(store, prefix=f"runs/{run.pk}")


@dataclass
class RunEngine:
    """What every process of a run derives from its config: model, fragments, data, eval batches.

    The data is either the in-memory byte corpus (``corpus``; data.format "bytes") or a text
    dataset streamed from ``data_store`` (``text``, tokenised by ``tokenizer``).
    """

    run_id: int
    rc: RunConfig
    model_cfg: AnyModelConfig
    fragments: list[list[str]]
    init: dict[str, torch.Tensor]
    corpus: Corpus | None
    eval_batches: list[tuple[torch.Tensor, torch.Tensor]]
    parameter_count: int
    text: TextDataset | None = None
    data_store: ObjectStore | None = None
    tokenizer: Tokenizer | None = None
    tokenizer_json: bytes | None = None  # copied into open-weights exports
    manifest: DatasetManifest | None = None  # the text dataset's split into shards
    eval_model: Any = None

    def evaluate(self, params: dict[str, torch.Tensor]) -> float:
        # Lazily: both import torch.
        from training.engine.data import evaluate
        from training.engine.model import load_params, make_model

        if self.eval_model is None:
            self.eval_model = make_model(self.model_cfg)
        load_params(self.eval_model, params)
        return evaluate(self.eval_model, self.eval_batches)


RunKey = tuple[int, str]


def run_key(run: TrainingRun) -> RunKey:
    """Cache key of a run: its id and creation time (a recreated database may reuse an id)."""
    return (run.pk, run.created_at.isoformat())


_ENGINES: dict[RunKey, RunEngine] = {}


def run_engine(run: TrainingRun) -> RunEngine:
    """The run's engine objects, built on first use in this process."""
    cached = _ENGINES.get(run_key(run))
    if cached is not None:
        return cached
    torch_threads_limit()
    # Lazily: the engine modules import torch.
    from training.engine.fragments import assign_fragments
    from training.engine.model import build_model

    rc = RunConfig(run.config)
    model_cfg: AnyModelConfig
    if rc.model_uri is not None:
        from training.engine.openweights import read_model_dir

        model_cfg, init, _ = read_model_dir(model_store(rc.model_uri), seed=rc.seed)
        if rc.block_size > model_cfg.context_length:
            raise ValueError(
                f"model.block_size {rc.block_size} is longer than the model's context ({model_cfg.context_length})"
            )
    else:
        model_cfg = rc.model_config()
        init = {n: p.detach().clone() for n, p in build_model(model_cfg, seed=rc.seed).named_parameters()}
        start = rc.start_from
        if start is not None and start["layout"] == "switchyard":
            init = _switchyard_weights(str(start["artifact_uri"]), init)
    fragments = assign_fragments(
        init, fragments=rc.fragment_count, assignment=rc.streaming_config().assignment
    )
    engine = RunEngine(
        run_id=run.pk,
        rc=rc,
        model_cfg=model_cfg,
        fragments=fragments,
        init=init,
        corpus=None,
        eval_batches=[],
        parameter_count=sum(t.numel() for t in init.values()),
    )
    if rc.data_format == "bytes":
        _load_byte_corpus(engine)
    else:
        _open_text_dataset(engine)
    # Keep a few runs at most: a long-lived worker serves many runs over its life.
    while len(_ENGINES) >= 4:
        _ENGINES.pop(next(iter(_ENGINES)))
    _ENGINES[run_key(run)] = engine
    return engine


def _switchyard_weights(uri: str, shapes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The parameters of a switchyard artifact (a byte-GPT model version), checked against the
    run's model by name and shape (validation fixed the architecture; this catches a changed
    object)."""
    _, params, _ = model_artifact_read(uri=uri, endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)
    if set(params) != set(shapes) or any(params[n].shape != t.shape for n, t in shapes.items()):
        raise ValueError(f"{uri} does not hold the weights of this run's model")
    return {n: params[n].float().clone() for n in shapes}


def _load_byte_corpus(engine: RunEngine) -> None:
    from training.engine.data import eval_batches, load_corpus  # lazily: imports torch

    rc = engine.rc
    data_cfg = rc.data_config()  # re-checks the dataset against the training data roots
    store = None
    if data_cfg.source == "objects":
        found = dataset_source(rc.raw["dataset"])
        assert found is not None  # noqa: S101 (data_config refused it otherwise)
        store = configured_store(f"s3://{found.bucket}")
        data_cfg = type(data_cfg)(
            **{**data_cfg.__dict__, "paths": dataset_keys(found, store.list(found.prefix))}
        )
    engine.corpus = load_corpus(data_cfg, store=store)
    engine.eval_batches = eval_batches(
        engine.corpus.eval, block_size=rc.block_size, windows=int(rc.raw["eval_windows"])
    )


def _open_text_dataset(engine: RunEngine) -> None:
    """The tokenizer, the dataset's object list and the held-out eval windows of a text dataset."""
    # Lazily: the engine modules import torch.
    from training.engine.openweights import TOKENIZER
    from training.engine.shards import run_manifest
    from training.engine.stream import TextDataset, check_tokens_fit, eval_batches
    from training.engine.stream import dataset_keys as stream_keys
    from training.engine.tokenizer import ByteTokenizer, JsonTokenizer, TokenizerError, eos_from_config

    rc = engine.rc
    tokenizer_json: bytes | None = None
    if rc.tokenizer_uri is not None:
        store, key = object_location(rc.tokenizer_uri, model=True)
        tokenizer_json = store.get(key)
    elif rc.model_uri is not None:
        store = model_store(rc.model_uri)
        if not store.exists(TOKENIZER):
            raise TokenizerError(f"{rc.model_uri} has no {TOKENIZER}; name one with tokenizer_uri")
        tokenizer_json = store.get(TOKENIZER)
    tokenizer: Tokenizer
    if tokenizer_json is None:
        tokenizer = ByteTokenizer()
    else:
        extra = getattr(engine.model_cfg, "extra", {})
        tokenizer = JsonTokenizer(tokenizer_json, eos_id=eos_from_config(extra))
    check_tokens_fit(tokenizer, engine.model_cfg.vocab_size)
    data_store, prefix = object_location(str(rc.raw["dataset"]))
    fmt = rc.data_format
    keys = stream_keys(data_store, prefix, fmt)  # type: ignore[arg-type]
    found = _source(str(rc.raw["dataset"]))
    if found.kind == "files":
        # A symlink under the dataset's folder that leads out of its root is not read.
        assert found.root is not None and found.path is not None  # noqa: S101 (kind == "files")
        base, root = found.path.parent, found.root
        keys = tuple(k for k in keys if _inside(Path(os.path.realpath(base / k)), root))
    text = TextDataset(
        keys=keys,
        format=fmt,  # type: ignore[arg-type]
        text_field=rc.text_field,
        eval_every_nth=rc.eval_every_nth_document,
    )
    engine.text, engine.data_store = text, data_store
    # The split into learners x ranks shards: built by the first process that opens the run,
    # stored with the run's objects, read by every other learner and rank.
    key = f"runs/{engine.run_id}/dataset/manifest.json"
    run_store = configured_store(rc.object_store_url)
    engine.manifest = run_manifest(run_store, key, data_store, text, shards=rc.learners * rc.ranks)
    engine.tokenizer, engine.tokenizer_json = tokenizer, tokenizer_json
    engine.eval_batches = eval_batches(
        data_store, text, tokenizer, block_size=rc.block_size, windows=int(rc.raw["eval_windows"])
    )


def learner_sampler(
    engine: RunEngine, *, index: int, generation: int, steps_done: int = 0, rank: int = 0
) -> Sampler:
    """Where rank ``rank`` of learner ``index`` draws its batches (see ``sampler_spec``)."""
    from training.engine.distributed import sampler_from_spec  # lazily: imports torch

    meta, tensors = sampler_spec(engine, index=index, generation=generation, steps_done=steps_done, rank=rank)
    return sampler_from_spec(meta, tensors, store=engine.data_store)


def sampler_spec(
    engine: RunEngine, *, index: int, generation: int, steps_done: int = 0, rank: int = 0
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The recipe of rank ``rank``'s sampler of learner ``index`` (JSON and tensors, no pickle):
    what training.engine.distributed.sampler_from_spec builds, in this process or a helper rank's.

    Each of a learner's ``learners.ranks`` ranks draws ``batch_size / ranks`` windows per step.
    The byte corpus gives a fresh random stream per generation and rank (a re-placed learner
    should not replay the batches its previous incarnation trained on). A text dataset gives
    the rank's shard (learner · ranks + rank of learners · ranks) in its fixed order,
    fast-forwarded past the windows of the ``steps_done`` steps the learner has already trained.
    """
    rc = engine.rc
    ranks = rc.ranks
    batch = rc.batch_size // ranks
    if engine.text is None or engine.data_store is None or engine.tokenizer is None:
        from training.engine.data import shard  # lazily: imports torch

        assert engine.corpus is not None  # noqa: S101 - one of the two is always built
        data = shard(engine.corpus.train, index=index, count=rc.learners, sharding=rc.data_config().sharding)
        seed = rc.raw["data"]["seed"] * 1_000_003 + index * 1009 + generation * 7919 + rank * 104_729 + 1
        return {"kind": "bytes", "block_size": rc.block_size, "batch_size": batch, "seed": seed}, {
            "data": data
        }
    text = engine.text
    meta: dict[str, Any] = {
        "kind": "stream",
        "store_url": engine.data_store.url,
        "endpoint_url": settings.OBJECT_STORE_ENDPOINT_URL,
        "keys": list(text.keys),
        "format": text.format,
        "text_field": text.text_field,
        "eval_every_nth": text.eval_every_nth,
        "eos_id": engine.tokenizer.eos_id,
        "block_size": rc.block_size,
        "batch_size": batch,
        "shard": index * ranks + rank,
        "shards": rc.learners * ranks,
        "skip": steps_done * batch,
        "manifest": engine.manifest.as_dict() if engine.manifest is not None else None,
    }
    tensors: dict[str, torch.Tensor] = {}
    if engine.tokenizer_json is not None:
        import torch  # lazily: the web process never loads torch

        tensors["tokenizer_json"] = torch.frombuffer(bytearray(engine.tokenizer_json), dtype=torch.uint8)
    return meta, tensors


def run_engine_forget(run: TrainingRun) -> None:
    """Drop a run's engine objects from this process."""
    _ENGINES.pop(run_key(run), None)


def newest_global(
    transport: ObjectStoreTransport, fragments: list[list[str]], *, held: bool = False
) -> tuple[dict[str, torch.Tensor], list[int], list[dict[str, Any]]]:
    """The global parameters assembled from each fragment's newest version.

    With `held`, the learners' copy (the syncer's mirror, which the down-deltas extend) instead
    of the exact parameters: what a (re)joining learner must start from to follow the chain.
    """
    params: dict[str, torch.Tensor] = {}
    versions: list[int] = []
    metas: list[dict[str, Any]] = []
    for f in range(len(fragments)):
        found = transport.versions(f)
        if not found:
            raise LookupError(f"fragment {f} has no published version")
        # The learners' copy alone is read when that is what is wanted (not params and momentum).
        v = transport.get_held(f, max(found)) if held else transport.get_version(f, max(found))
        params.update(v.held if held else v.params)
        versions.append(v.version)
        metas.append(v.meta)
    return params, versions, metas


def version_params(
    transport: ObjectStoreTransport, fragments: list[list[str]], versions: list[int]
) -> dict[str, torch.Tensor]:
    """The global parameters with fragment f at version ``versions[f]`` (published versions stay
    in the store, so any of them can be assembled again, with the same result)."""
    params: dict[str, torch.Tensor] = {}
    for f, v in enumerate(versions):
        params.update(transport.get_version(f, v).params)
    return params


def run_initialise(run: TrainingRun) -> float:
    """Publish version 0 of every fragment (write-once) and return the initial eval loss."""
    from training.engine.syncer import Syncer  # lazily: imports torch

    engine = run_engine(run)
    transport = run_transport(run)
    Syncer(
        cfg=engine.rc.syncer_config(),
        outer=engine.rc.outer_config(),
        fragments=engine.fragments,
        init=engine.init,
        transport=transport,
        down=engine.rc.compression_config().down_kind,
        offload=True,  # version 0 straight from engine.init, no copy kept
    )
    params, _, _ = newest_global(transport, engine.fragments)
    return engine.evaluate(params)


def write_artifact(run: TrainingRun, *, kind: str) -> tuple[str, float, int, list[int]]:
    """The newest global parameters as a model artifact: (uri, eval loss, parameter count, versions)."""
    engine = run_engine(run)
    transport = run_transport(run)
    params, versions, _ = newest_global(transport, engine.fragments)
    loss = engine.evaluate(params)
    from training.engine.model import model_config_to_dict  # lazily: imports torch

    key = f"runs/{run.pk}/artifacts/{kind}-v{'-'.join(map(str, versions))}.syd"
    uri = model_artifact_write(
        store_url=engine.rc.object_store_url,
        key=key,
        model_config=model_config_to_dict(engine.model_cfg),
        params=params,
        meta={"run_id": run.pk, "kind": kind, "versions": versions, "eval_loss": loss},
        endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL,
    )
    return uri, loss, engine.parameter_count, versions


def write_model_version(run: TrainingRun, *, params: dict[str, torch.Tensor], name: str) -> tuple[str, str]:
    """Write a model version's weights: (URI, layout).

    A brought Llama or GPT-2 is written in the open-weights layout under
    ``runs/<id>/exports/<name>/`` (servable as is by vLLM, TGI or serve_model); the byte-level
    GPT as a switchyard artifact ``runs/<id>/artifacts/<name>.syd``. Both are deterministic in
    ``params``, so a second write of the same version leaves the same bytes.
    """
    from training.engine.model import GPT2Config, LlamaConfig, model_config_to_dict  # lazily: torch
    from training.engine.openweights import write_model_dir

    engine = run_engine(run)
    if isinstance(engine.model_cfg, LlamaConfig | GPT2Config):
        url = f"{engine.rc.object_store_url.rstrip('/')}/runs/{run.pk}/exports/{name}"
        store = open_store(url, endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)
        write_model_dir(store, cfg=engine.model_cfg, params=params, tokenizer_json=engine.tokenizer_json)
        return url, "open-weights"
    uri = model_artifact_write(
        store_url=engine.rc.object_store_url,
        key=f"runs/{run.pk}/artifacts/{name}.syd",
        model_config=model_config_to_dict(engine.model_cfg),
        params=params,
        meta={"run_id": run.pk, "kind": "model-version", "name": name},
        endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL,
    )
    return uri, "switchyard"


def run_model_family(run: TrainingRun) -> tuple[str, str]:
    """(family, tokenizer) of the run's model as the registry names them: ``gpt-byte``/``bytes``,
    or the config.json's model_type and ``tokenizer.json`` (``bytes`` without one)."""
    from training.engine.model import GPT2Config, LlamaConfig  # lazily: imports torch

    engine = run_engine(run)
    if not isinstance(engine.model_cfg, LlamaConfig | GPT2Config):
        return "gpt-byte", "bytes"
    tokenizer = "tokenizer.json" if engine.tokenizer_json is not None else "bytes"
    return str(engine.model_cfg.to_hf()["model_type"]), tokenizer


def export_open_weights(run: TrainingRun, *, name: str, dtype: str | None = None) -> tuple[str, list[int]]:
    """The newest global parameters as an open-weights directory: (its URI, the versions exported).

    Written under ``runs/<id>/exports/<name>/`` of the run's object store: config.json,
    model.safetensors and the run's tokenizer.json (training.engine.openweights), the layout
    vLLM or TGI serve from. Only runs of a brought model (model_uri) have that layout.
    """
    from training.engine.model import GPT2Config, LlamaConfig  # lazily: imports torch
    from training.engine.openweights import write_model_dir

    engine = run_engine(run)
    if not isinstance(engine.model_cfg, LlamaConfig | GPT2Config):
        raise ValueError("only a model brought as config.json (model_uri) exports in the open-weights layout")
    params, versions, _ = newest_global(run_transport(run), engine.fragments)
    url = f"{engine.rc.object_store_url.rstrip('/')}/runs/{run.pk}/exports/{name}"
    store = open_store(url, endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)
    write_model_dir(
        store, cfg=engine.model_cfg, params=params, tokenizer_json=engine.tokenizer_json, dtype=dtype
    )
    return url, versions
