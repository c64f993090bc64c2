"""A run's model versions: every k-th global version and the final parameters, each registered once.

The syncer tick calls `model_versions_register_due` after it has recorded the versions it
published; `training_run_succeed` calls `model_version_register_final`. A model version is the
global parameters with every fragment at the same version g (g = k, 2k, ...; versions stay in
the object store, so they can be assembled again at any later tick) or, for the final one, at
each fragment's newest version. The weights are written first (deterministic bytes: a re-run
writes the same object), then the row; (run, key) is unique, so a syncer task that runs twice,
or two racing syncer chains, register a version once.

Tokens and cost of a k-th version are those the run had recorded when that version was
published (GlobalVersionRecord: tokens merged, the ledger's spend); the final version's cost is
the ledger's spend when the run succeeds.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Max
from django.utils.text import slugify

from registry.models import RegisteredModel
from training import selectors
from training.models import GlobalVersionRecord, ModelVersion, TrainingRun
from training.run_engines import (
    RunEngine,
    newest_global,
    run_model_family,
    version_params,
    write_model_version,
)
from training.signals import model_version_registered

if TYPE_CHECKING:
    import torch

    from training.engine.transport import ObjectStoreTransport

logger = logging.getLogger(__name__)

FINAL_KEY = "final"


def run_model_slug(run: TrainingRun) -> str:
    """The slug of the registered model a run's versions belong to."""
    return slugify(f"run-{run.pk}-{run.name}")[:64].strip("-") or f"run-{run.pk}"


def _registered_model(run: TrainingRun, engine: RunEngine) -> RegisteredModel:
    """The run's registered model, created with its first version (and linked to the run)."""
    family, tokenizer = run_model_family(run)
    context = getattr(engine.model_cfg, "context_length", None) or engine.rc.block_size
    model, _ = RegisteredModel.objects.get_or_create(
        slug=run_model_slug(run),
        defaults={
            "family": family,
            "parameter_count": engine.parameter_count,
            "produced_by_run_id": run.pk,
            "tokenizer": tokenizer,
            "context_length": int(context),
        },
    )
    if run.registered_model_id != model.pk:
        TrainingRun.objects.filter(pk=run.pk).update(registered_model=model)
        run.registered_model = model
    return model


def _register(
    *,
    run: TrainingRun,
    engine: RunEngine,
    key: str,
    versions: list[int],
    params: dict[str, torch.Tensor],
    tokens: int,
    cost: Decimal,
    final: bool,
) -> ModelVersion:
    existing = ModelVersion.objects.filter(run=run, key=key).first()
    if existing is not None:
        return existing
    name = f"final-v{'-'.join(map(str, versions))}" if final else f"v{key}"
    # Slow work (an eval pass, writing the weights) outside the transaction; both are
    # deterministic in `params`, so a racing writer of the same version writes the same bytes.
    uri, layout = write_model_version(run, params=params, name=name)
    loss = engine.evaluate(params)
    with transaction.atomic():
        model = _registered_model(run, engine)
        # The model row is the lock that numbers its versions one at a time.
        RegisteredModel.objects.select_for_update().filter(pk=model.pk).first()
        existing = ModelVersion.objects.filter(run=run, key=key).first()
        if existing is not None:
            return existing
        number = (
            ModelVersion.objects.filter(registered_model=model).aggregate(n=Max("number"))["n"] or 0
        ) + 1
        version = ModelVersion.objects.create(
            registered_model=model,
            number=number,
            run=run,
            key=key,
            global_version=min(versions),
            fragment_versions=list(versions),
            final=final,
            eval_loss=loss,
            tokens=tokens,
            cost=cost,
            currency=run.currency,
            artifact_uri=uri,
            layout=layout,
        )
        # The model serves its newest version.
        RegisteredModel.objects.filter(pk=model.pk).update(artifact_uri=uri)
        # After COMMIT: a receiver's task must find the row; a rolled-back version sends nothing.
        version_id, run_id = version.pk, run.pk
        transaction.on_commit(
            lambda: model_version_registered.send_robust(
                sender=ModelVersion, version_id=version_id, run_id=run_id
            )
        )
    logger.info("run %s: registered %s (versions %s, eval loss %.4f)", run.pk, version, versions, loss)
    return version


def model_versions_register_due(
    *, run: TrainingRun, engine: RunEngine, transport: ObjectStoreTransport
) -> list[ModelVersion]:
    """Register every k-th global version that every fragment has reached and no row holds yet."""
    k = engine.rc.register_every_versions
    fragments = len(engine.fragments)
    if k <= 0:
        return []
    records = GlobalVersionRecord.objects.filter(run=run)
    newest = dict(records.values_list("fragment").annotate(v=Max("version")).values_list("fragment", "v"))
    if len(newest) < fragments:
        return []
    reached = min(newest.values())
    done = set(ModelVersion.objects.filter(run=run, final=False).values_list("global_version", flat=True))
    made = []
    for g in range(k, reached + 1, k):
        if g in done:
            continue
        at_g = records.filter(version=g).aggregate(tokens=Max("tokens_total"), cost=Max("cost_so_far"))
        made.append(
            _register(
                run=run,
                engine=engine,
                key="-".join([str(g)] * fragments),
                versions=[g] * fragments,
                params=version_params(transport, engine.fragments, [g] * fragments),
                tokens=int(at_g["tokens"] or 0),
                cost=at_g["cost"] or Decimal("0"),
                final=False,
            )
        )
    return made


def model_version_register_final(
    *, run: TrainingRun, engine: RunEngine, transport: ObjectStoreTransport
) -> ModelVersion:
    """Register the run's newest global parameters as its final version (once), and set the
    registered model's final eval loss and training cost."""
    params, versions, _ = newest_global(transport, engine.fragments)
    tokens = GlobalVersionRecord.objects.filter(run=run).aggregate(t=Max("tokens_total"))["t"] or 0
    version = _register(
        run=run,
        engine=engine,
        key=FINAL_KEY,
        versions=versions,
        params=params,
        tokens=int(tokens),
        cost=selectors.run_spend(run_id=run.pk),
        final=True,
    )
    RegisteredModel.objects.filter(pk=version.registered_model_id).update(
        artifact_uri=version.artifact_uri, final_eval_loss=version.eval_loss, training_cost=version.cost
    )
    version.registered_model.refresh_from_db()
    return version
