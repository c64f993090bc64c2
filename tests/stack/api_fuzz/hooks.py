"""Schemathesis hooks for tests/stack/test_api_fuzz.py, loaded by the schemathesis process it starts.

The coverage phase sends its bodies as JSON only where an operation takes JSON. It derives each
body case (a boundary value, a wrong type, a missing field) once per media type an operation
takes, and most take three (JSON, form and multipart), so it would send every case three times;
the form and multipart parsers hand the same fields to the same serializer. Operations that take
only a file upload keep their multipart cases, and the fuzzing phase still sends all three types.
"""

from __future__ import annotations

from typing import Any

import schemathesis

JSON = "application/json"
FORMS = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    meta = case.meta
    if meta is None or meta.phase.name != "coverage" or case.media_type not in FORMS:
        return True
    operation = case.operation
    return JSON not in operation.schema.get_request_payload_content_types(operation)
