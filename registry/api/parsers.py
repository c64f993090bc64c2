"""The API's parsers. JSON: a bounded body (size, depth, values), JSON's types with finite numbers,
text that can be stored, and an object at the top (every endpoint takes named fields).

Every JSON body of the API passes here (REST_FRAMEWORK's DEFAULT_PARSER_CLASSES), so none of
those inputs reaches a serializer, a service or the database: a body nested thousands deep was a
RecursionError, a list where an object belongs an AttributeError, a NUL in a slug a DataError.
A refused string answers 400 naming its field by its dotted path. Form and multipart bodies:
DRF's parsers, with the middleware's check of the fields' text (registry.middleware).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser

from registry.middleware import form_text_problems
from registry.validation import InputError, json_parse

MAX_JSON_BODY_BYTES = 20 * 1024 * 1024  # as large as a price or invoice file upload


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = "too_large"


class BoundedJSONParser(JSONParser):
    max_bytes = MAX_JSON_BODY_BYTES

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        body = stream.read(self.max_bytes + 1)
        if len(body) > self.max_bytes:
            raise RequestTooLarge(f"the body is larger than {self.max_bytes} bytes")
        try:
            text = body.decode(encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"the body is not {encoding} text: {exc}") from None
        try:
            data = json_parse(text)
        except InputError as exc:
            if exc.field is None:
                raise ParseError(f"JSON parse error - {exc}") from None
            raise ValidationError({exc.field: [str(exc)]}) from None
        if not isinstance(data, dict):
            raise ParseError(f"the body must be a JSON object with named fields, not a {_json_type(data)}")
        return data


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"


def _refuse_bad_text(data: Any, files: Any = None) -> None:
    problems = form_text_problems(data, files)
    if problems:
        raise ValidationError(problems)


class CheckedFormParser(FormParser):
    """DRF's form parser; a field holding text that cannot be stored answers 400 naming it."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        data = super().parse(stream, media_type, parser_context)
        _refuse_bad_text(data)
        return data


class CheckedMultiPartParser(MultiPartParser):
    """DRF's multipart parser, with the form parser's check on fields and file names."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        _refuse_bad_text(parsed.data, parsed.files)
        return parsed
