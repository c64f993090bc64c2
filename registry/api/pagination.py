"""The API's one pagination: ?limit= and ?offset=, bounded so no page reaches the database
with numbers it cannot take (a LIMIT beyond bigint was a server error).

A limit above MAX_LIMIT is served as MAX_LIMIT (the `next` link goes on from there); a limit or
offset that is not a whole number in ASCII digits, a limit below 1 or an offset outside 0 to
bigint's maximum is refused with 400 naming the parameter.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from registry.validation import BIGINT_MAX, InputError, int_parse

MAX_LIMIT = 1000


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def _param(self, request: Request, name: str, *, minimum: int, maximum: int | None) -> int | None:
        raw = request.query_params.get(name, "")
        if raw == "":
            return None
        try:
            return int_parse(raw, minimum=minimum, maximum=maximum)
        except InputError as exc:
            raise ValidationError({name: [str(exc)]}) from None

    def get_limit(self, request: Request) -> int | None:
        # No upper bound here: a larger limit is served as max_limit, as DRF does.
        limit = self._param(request, self.limit_query_param, minimum=1, maximum=None)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        offset = self._param(request, self.offset_query_param, minimum=0, maximum=BIGINT_MAX)
        return 0 if offset is None else offset

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        bounds = {
            self.limit_query_param: {"minimum": 1},
            self.offset_query_param: {"minimum": 0, "maximum": BIGINT_MAX},
        }
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"] = {**parameter["schema"], **bounds.get(parameter["name"], {})}
            if parameter["name"] == self.limit_query_param:
                parameter["description"] = (
                    f"{parameter['description']} At most {self.max_limit}: a larger limit is served as "
                    f"{self.max_limit}."
                )
        return parameters
