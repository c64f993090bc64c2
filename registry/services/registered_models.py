"""Registered models: created and changed here only (the API, the page form and the Django
admin call these), so a model's rules are checked in one place."""

from __future__ import annotations

from typing import Any

from registry.models import RegisteredModel
from registry.services.errors import RegistryError
from registry.services.records import fields_assign
from registry.store.objectstore import store_uri_problem

REGISTERED_MODEL_FIELDS = frozenset(
    {"slug", "family", "parameter_count", "artifact_uri", "produced_by_run_id", "tokenizer", "context_length"}
)


def registered_model_artifact_uri_check(artifact_uri: str) -> None:
    """A model's artifact is a URI of the object store the workers read
    (registry.store.objectstore), or none."""
    if artifact_uri and (problem := store_uri_problem(artifact_uri)):
        raise RegistryError(problem, field="artifact_uri")


def registered_model_check(model: RegisteredModel) -> None:
    """A model's rules, on the state it would be saved with."""
    registered_model_artifact_uri_check(model.artifact_uri)


def registered_model_create(**fields: Any) -> RegisteredModel:
    """A new model of `fields` (REGISTERED_MODEL_FIELDS); RegistryError when a rule refuses it."""
    model = fields_assign(RegisteredModel(), fields, REGISTERED_MODEL_FIELDS)
    registered_model_check(model)
    model.save()
    return model


def registered_model_update(model: RegisteredModel, **fields: Any) -> RegisteredModel:
    """Change the given fields; the rules are checked on the result."""
    fields_assign(model, fields, REGISTERED_MODEL_FIELDS)
    registered_model_check(model)
    model.save()
    return model
