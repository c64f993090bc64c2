"""Fields that only some roles may set on objects that other roles may otherwise change.

Operators register and change clusters (stack.access); where a cluster keeps its learners'
state is another matter: its own object store (URL, endpoint, credentials) decides where model
weights and optimizer state are written, and with which keys. Admins set it, as they set the
installation's store (OBJECT_STORE_URL). This table is the one rule; the API serializers refuse
such a field from anyone else (403 naming it, nothing written), and the page forms leave it out
for them (the stored value stays). The Django admin is for admins already.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from registry.auth.principal import Principal
from registry.auth.roles import ADMINS, Role
from registry.models import Cluster

_STORE_FIELDS = (
    "object_store_url",
    "object_store_endpoint_url",
    "object_store_credentials",
    "clear_object_store_credentials",
)

FIELD_WRITERS: dict[type[models.Model], dict[str, frozenset[Role]]] = {
    Cluster: dict.fromkeys(_STORE_FIELDS, ADMINS),
}


def fields_refused(
    model: type[models.Model], principal: Principal, changes: dict[str, Any], instance: Any = None
) -> list[str]:
    """The fields among `changes` this principal may not set on a `model` row (shared objects:
    roles held platform-wide). A model field given its stored value is no change; a write-only
    input (the credentials: '' clears them) is a change whenever it is given."""
    refused = []
    for name, allowed in FIELD_WRITERS.get(model, {}).items():
        if name not in changes or principal.may(allowed, None):
            continue
        value = changes[name]
        if hasattr(model, name):  # a model field: compared with what is stored (or its default)
            stored = getattr(instance if instance is not None else model(), name)
            if value == stored:
                continue
        elif value is None or value is False:
            continue
        refused.append(name)
    return refused


def form_fields_restrict(form: Any, principal: Principal) -> None:
    """Leave the fields this principal may not set out of a page form of their model."""
    model = getattr(getattr(form, "_meta", None), "model", None)
    for name, allowed in FIELD_WRITERS.get(model, {}).items():  # type: ignore[arg-type]
        if name in form.fields and not principal.may(allowed, None):
            del form.fields[name]
