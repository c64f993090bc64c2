"""Django REST framework's and drf-spectacular's settings: every /api/ class named once (the
registry's authentication, permissions, parsers, pagination and filters; the project's errors)."""

from __future__ import annotations

from typing import Any


def rest_framework_settings() -> dict[str, Any]:
    return {
        "DEFAULT_AUTHENTICATION_CLASSES": [
            # Bearer first: its WWW-Authenticate header makes DRF answer 401
            # (not 403) to requests that carry no credentials.
            "registry.api.authentication.BearerTokenAuthentication",
            "rest_framework.authentication.SessionAuthentication",
        ],
        "DEFAULT_PERMISSION_CLASSES": ["registry.api.permissions.RolePermission"],
        "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
        # Money figures only for those who may see costs (registry.auth.costs).
        "DEFAULT_RENDERER_CLASSES": [
            "registry.auth.costs.CostAwareJSONRenderer",
            "rest_framework.renderers.BrowsableAPIRenderer",
        ],
        # Bounded ?limit= and ?offset= (registry.api.pagination); bodies bounded and checked
        # (registry.api.parsers): every input the API takes is refused with 400, never a 500.
        "DEFAULT_PAGINATION_CLASS": "registry.api.pagination.BoundedLimitOffsetPagination",
        # Unknown query parameters answer 400 naming them (registry.api.query_params).
        # A token limited to workflows sees only their rows (registry.auth.scoping).
        "DEFAULT_FILTER_BACKENDS": [
            "registry.api.query_params.KnownQueryParams",
            "registry.auth.scoping.WorkflowScopeFilter",
        ],
        "DEFAULT_PARSER_CLASSES": [
            "registry.api.parsers.BoundedJSONParser",
            "registry.api.parsers.CheckedFormParser",
            "registry.api.parsers.CheckedMultiPartParser",
        ],
        "PAGE_SIZE": 100,
        "EXCEPTION_HANDLER": "stack.api_errors.exception_handler",
        "COERCE_DECIMAL_TO_STRING": True,
    }


def spectacular_settings() -> dict[str, Any]:
    return {
        "TITLE": "Switchyard API",
        "DESCRIPTION": "Registry, jobs and usage ledger of the Switchyard control plane.",
        "VERSION": "0.1.0",
        "SERVE_INCLUDE_SCHEMA": False,
        # Error answers and slug formats, documented once for every operation (registry.api.schema).
        "POSTPROCESSING_HOOKS": [
            "drf_spectacular.hooks.postprocess_schema_enums",
            "registry.api.schema.error_responses",
            "registry.api.schema.money_keys_optional",
        ],
        # Choice sets that share a field name get a name of their own (equal sets share one).
        "ENUM_NAME_OVERRIDES": {
            "JobStatusEnum": "training.models.ProbeJob.Status",  # also ExportJob.Status, EvalRun.State
            "TrainingRunStateEnum": "training.models.TrainingRun.State",
            "BatchJobStateEnum": "inference.models.BatchJob.State",
        },
    }
