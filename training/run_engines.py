"""A run's engine objects in this process (built from its config, cached), version 0 and artifacts.

The engine (training/engine) is used as is. What every process of a run derives from its config
(fragments, corpus, eval batches, the initial parameters) is built once per worker process and
kept in `_ENGINES`; training.services publishes version 0 and writes artifacts through here, and
training.orchestrator's chunk and syncer loops build on it. No database writes happen here.

The engine modules import torch at the top, so they are imported inside the functions that use
them: the web process imports this module (through training.services) without loading torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from storage.artifacts import model_artifact_write
from storage.objectstore import open_store
from training.models import TrainingRun
from training.run_config import RunConfig

if TYPE_CHECKING:
    import torch

    from training.engine.checkpoint import CheckpointStore
    from training.engine.data import Corpus
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
    store = open_store(rc.object_store_url, endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)
    return ObjectStoreTransport(store, prefix=f"runs/{run.pk}")


def run_checkpoints(run: TrainingRun) -> CheckpointStore:
    """The run's learner checkpoints (`runs/<id>/learners/` of object_store_url)."""
    from training.engine.checkpoint import CheckpointStore  # lazily: imports torch

    rc = RunConfig(run.config)
    store = open_store(rc.object_store_url, endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)
    return CheckpointStore(store, prefix=f"runs/{run.pk}")


@dataclass
class RunEngine:
    """What every process of a run derives from its config: fragments, data, eval batches."""

    run_id: int
    rc: RunConfig
    fragments: list[list[str]]
    init: dict[str, torch.Tensor]
    corpus: Corpus
    eval_batches: list[tuple[torch.Tensor, torch.Tensor]]
    parameter_count: int
    eval_model: Any = None

    def evaluate(self, params: dict[str, torch.Tensor]) -> float:
        # Lazily: both import torch.
        from training.engine.data import evaluate
        from training.engine.model import GPT

        if self.eval_model is None:
            self.eval_model = GPT(self.rc.model_config())
        self.eval_model.load_state_dict(params)
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
    from training.engine.data import eval_batches, load_corpus
    from training.engine.fragments import assign_fragments
    from training.engine.model import build_model, param_count

    rc = RunConfig(run.config)
    model = build_model(rc.model_config(), seed=rc.seed)
    params = dict(model.named_parameters())
    fragments = assign_fragments(
        params, fragments=rc.fragment_count, assignment=rc.streaming_config().assignment
    )
    data_cfg = rc.data_config()
    store = None
    if data_cfg.source == "objects":
        uri = str(rc.raw["dataset"])
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        store = open_store(f"s3://{bucket}", endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL)
        data_cfg = type(data_cfg)(**{**data_cfg.__dict__, "paths": tuple(sorted(store.list(prefix)))})
    corpus = load_corpus(data_cfg, store=store)
    batches = eval_batches(
        corpus.eval, block_size=rc.model_config().block_size, windows=int(rc.raw["eval_windows"])
    )
    engine = RunEngine(
        run_id=run.pk,
        rc=rc,
        fragments=fragments,
        init={n: p.detach().clone() for n, p in params.items()},
        corpus=corpus,
        eval_batches=batches,
        parameter_count=param_count(model),
    )
    # Keep a few runs at most: a long-lived worker serves many runs over its life.
    while len(_ENGINES) >= 4:
        _ENGINES.pop(next(iter(_ENGINES)))
    _ENGINES[run_key(run)] = engine
    return engine


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
    from training.engine.transport import latest_version  # lazily: imports torch

    params: dict[str, torch.Tensor] = {}
    versions: list[int] = []
    metas: list[dict[str, Any]] = []
    for f in range(len(fragments)):
        v = latest_version(transport, f)
        if v is None:
            raise LookupError(f"fragment {f} has no published version")
        params.update(v.held if held else v.params)
        versions.append(v.version)
        metas.append(v.meta)
    return params, versions, metas


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
    )
    params, _, _ = newest_global(transport, engine.fragments)
    return engine.evaluate(params)


def write_artifact(run: TrainingRun, *, kind: str) -> tuple[str, float, int, list[int]]:
    """The newest global parameters as a model artifact: (uri, eval loss, parameter count, versions)."""
    engine = run_engine(run)
    transport = run_transport(run)
    params, versions, _ = newest_global(transport, engine.fragments)
    loss = engine.evaluate(params)
    key = f"runs/{run.pk}/artifacts/{kind}-v{'-'.join(map(str, versions))}.syd"
    uri = model_artifact_write(
        store_url=engine.rc.object_store_url,
        key=key,
        model_config=dataclasses.asdict(engine.rc.model_config()),
        params=params,
        meta={"run_id": run.pk, "kind": kind, "versions": versions, "eval_loss": loss},
        endpoint_url=settings.OBJECT_STORE_ENDPOINT_URL,
    )
    return uri, loss, engine.parameter_count, versions
