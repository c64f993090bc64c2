"""What the OpenAPI schema says about every /api/ operation, beyond each view's own serializers.

- `BearerTokenScheme`: the security scheme of our bearer tokens. drf-spectacular registers an
  extension when its class is defined, so RegistryConfig.ready imports this module (importing it
  from authentication.py would be circular: drf-spectacular imports DRF's views, which load the
  authentication classes).
- `error_responses`: drf-spectacular documents each view's success response; the error answers
  are the same everywhere (DRF's exceptions and stack.api_errors), so one post-processing hook
  documents them for every operation instead of a decorator on each view. It runs after
  drf-spectacular's enum hook (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]).
- `SchemaView`: /api/schema/, generated one at a time per process (see its docstring).
"""

from __future__ import annotations

import threading
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SCHEMA_KWARGS, SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from registry.api.authentication import BearerTokenAuthentication
from registry.auth.costs import is_money_key


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """`Authorization: Bearer sy_...`, listed as `bearerAuth` beside DRF's session `cookieAuth`."""

    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (`sy_...`) from the Tokens page or `manage.py apitoken`.",
        }


# A slug is a Django SlugField (validate_slug): every object addressed by slug has one of these.
SLUG_PATTERN = r"^[-a-zA-Z0-9_]+$"

_DETAIL = {"$ref": "#/components/schemas/ErrorDetail"}
_FIELDS = {"$ref": "#/components/schemas/FieldErrors"}

COMPONENTS: dict[str, dict[str, Any]] = {
    "ErrorDetail": {
        "type": "object",
        "description": "An error about the request as a whole.",
        "properties": {"detail": {"type": "string"}},
        "required": ["detail"],
    },
    "FieldErrors": {
        "type": "object",
        "description": (
            "Refused input: messages per field name (`non_field_errors` for the request as a whole, "
            "nested as the input is), `detail` for an unreadable body, or `errors` (line, column, "
            "message) for a refused file."
        ),
        "additionalProperties": {},
    },
}


def _response(description: str, schema: dict[str, str]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# A path that no route matches (an id that is not a number, a slug with a dot) never reaches DRF;
# registry.middleware.ApiNotFoundMiddleware answers it in the same shape.
_NOT_FOUND = _response("No such object.", _DETAIL)


def _takes_input(operation: dict[str, Any]) -> bool:
    return "requestBody" in operation or bool(operation.get("parameters"))


def error_responses(
    result: dict[str, Any], generator: Any, request: Any, public: bool, **kwargs: Any
) -> dict[str, Any]:
    """Document the error answers that every operation can give, and the format of slugs in paths.

    - 400 (FieldErrors) where the operation takes input: serializer and domain errors (DomainError).
    - 401 without valid credentials; 403 when the caller's role may not do this (RolePermission).
    - 404 where the path names an object; 409 on DELETE of an object still referenced (ProtectedError).
    """
    result.setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            if _takes_input(operation):
                responses.setdefault("400", _response("Refused input.", _FIELDS))
            responses.setdefault("401", _response("No valid credentials.", _DETAIL))
            responses.setdefault("403", _response("This role may not do this.", _DETAIL))
            parameters = operation.get("parameters", [])
            if any(p.get("in") == "path" for p in parameters):
                responses.setdefault("404", _NOT_FOUND)
            if method == "delete":
                responses.setdefault("409", _response("Still referenced by other records.", _DETAIL))
            for parameter in parameters:
                if parameter.get("in") == "path" and parameter.get("name") == "slug":
                    parameter["schema"] = {**parameter["schema"], "pattern": SLUG_PATTERN}
    return result


def money_keys_optional(
    result: dict[str, Any], generator: Any, request: Any, public: bool, **kwargs: Any
) -> dict[str, Any]:
    """Money fields are never required in an answer: a viewer's answers leave them out
    (registry.auth.costs, the one money rule), so the schema says they may be absent."""
    for component in result.get("components", {}).get("schemas", {}).values():
        required = component.get("required")
        if not required:
            continue
        money = [name for name in required if is_money_key(name)]
        if not money:
            continue
        component["required"] = [name for name in required if not is_money_key(name)]
        if not component["required"]:
            del component["required"]
        for name in money:
            prop = component.get("properties", {}).get(name)
            if isinstance(prop, dict) and "$ref" not in prop:
                note = "Absent for roles that may not see costs (viewers)."
                prop["description"] = f"{prop['description']} {note}" if prop.get("description") else note
    return result


class SchemaView(SpectacularAPIView):
    """drf-spectacular's schema view, generating one schema at a time in a process.

    Its generator keeps state in classes that every thread shares: extensions load their target
    class on first use and set it to None when the import fails, while another thread reads it
    (AttributeError: 'NoneType' object has no attribute 'startswith'), and GENERATOR_STATS counts
    warnings. Four clients asking for the schema at once got a 500 from the threaded server.
    Upstream: https://github.com/tfranzel/drf-spectacular/issues/1123 and issues/1368."""

    _generating = threading.Lock()
    shared_with_teams = True  # the API's shape holds no team's rows

    @extend_schema(**SCHEMA_KWARGS)  # as the view it extends: the schema leaves itself out
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        with self._generating:
            return super().get(request, *args, **kwargs)
