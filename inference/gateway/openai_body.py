"""The checks under every OpenAI-style request (pure Python): the JSON body itself (strict, bounded
in depth and values, valid Unicode throughout) and the typed fields every endpoint shares, each
refused as an `InvalidRequest` naming its field (inference.gateway.openai_request explains the rules)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 32  # a chat body needs 5 (body, messages, message, content parts, part)
MAX_VALUES = 100_000  # bounds the walk below (a few tens of ms) whatever the body size allows
MAX_STOP = 4
MAX_N = 128  # OpenAI's own limit on choices per request
MAX_TOKENS_LIMIT = 1_048_576  # above any model's output today; keeps budget estimates finite
MODEL_MAX_LENGTH = 256
USER_MAX_LENGTH = 256
INT64 = (-(2**63), 2**63 - 1)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# C0 and C1 control characters and DEL: a slug never holds one, and PostgreSQL refuses NUL.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class InvalidRequest(ValueError):
    """A request no provider can take: answered with `status` and an OpenAI-style body."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_request", status: int = 400
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


def error_document(
    message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_document(raw: bytes | str) -> dict[str, Any]:
    """The body as a JSON object whose every string is valid Unicode (see the module docstring)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        doc = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidRequest("The request body is not UTF-8 text", code="invalid_body") from None
    except ValueError:
        raise InvalidRequest("The request body is not valid JSON", code="invalid_body") from None
    except RecursionError:
        raise InvalidRequest(
            f"The request body is nested more than {MAX_DEPTH} levels deep", code="invalid_body"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidRequest("The request body must be a JSON object", code="invalid_body")
    document_check(doc)
    return doc


def param_segment(key: str) -> str:
    # A key may itself be the bad string: show it escaped, never as a lone surrogate again.
    return key.encode("utf-8", "backslashreplace").decode("utf-8")[:64]


def _param(path: tuple[str | int, ...]) -> str | None:
    out = ""
    for part in path:
        out += (
            f"[{part}]"
            if isinstance(part, int)
            else (f".{param_segment(part)}" if out else param_segment(part))
        )
    return out[:200] or None


def _unicode_ok(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def document_check(doc: Any) -> None:
    """Depth, count, finite numbers and valid Unicode over a parsed JSON value (iteratively)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(doc, 1, ())]
    seen = 0
    while stack:
        value, depth, path = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InvalidRequest(f"The request body holds more than {MAX_VALUES} values", code="invalid_body")
        if isinstance(value, str):
            if not _unicode_ok(value):
                where = _param(path)
                raise InvalidRequest(
                    f"{where or 'A string'} is not valid Unicode (a lone surrogate such as \\ud800)",
                    param=where,
                    code="invalid_unicode",
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                where = _param(path)
                raise InvalidRequest(f"{where} is out of range", param=where, code="invalid_number")
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise InvalidRequest(
                    f"The request body is nested more than {MAX_DEPTH} levels deep",
                    param=_param(path),
                    code="invalid_body",
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    if not _unicode_ok(key):
                        where = _param((*path, key))
                        raise InvalidRequest(
                            f"The key {where} is not valid Unicode (a lone surrogate such as \\ud800)",
                            param=where,
                            code="invalid_unicode",
                        )
                    stack.append((item, depth + 1, (*path, key)))
            else:
                stack.extend((item, depth + 1, (*path, i)) for i, item in enumerate(value))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def integer_field(
    doc: dict[str, Any], name: str, low: int, high: int, *, code: str | None = None
) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if not is_int(value) or not low <= value <= high:
        raise InvalidRequest(
            f"{name} must be an integer from {low} to {high}", param=name, code=code or f"invalid_{name}"
        )
    return int(value)


def _number(doc: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = doc.get(name)
    if value is None:
        return None
    if not _is_number(value) or not low <= value <= high:
        raise InvalidRequest(
            f"{name} must be a number between {low:g} and {high:g}", param=name, code=f"invalid_{name}"
        )
    return float(value)


def model_field(doc: dict[str, Any], *, required: bool) -> str | None:
    model = doc.get("model")
    if model is None and not required:
        return None
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "model is required: the slug of a Switchyard workflow", param="model", code="invalid_model"
        )
    if len(model) > MODEL_MAX_LENGTH or _CONTROL.search(model):
        raise InvalidRequest(
            f"model must be at most {MODEL_MAX_LENGTH} characters without control characters",
            param="model",
            code="invalid_model",
        )
    return model


def _stop(doc: dict[str, Any]) -> tuple[str, ...]:
    stop = doc.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest(
            f"stop must be a string or a list of at most {MAX_STOP} strings",
            param="stop",
            code="invalid_stop",
        )
    return tuple(stops)


def field_error(name: str, message: str, code: str | None = None) -> InvalidRequest:
    return InvalidRequest(
        f"{name} {message}", param=name, code=code or f"invalid_{name.split('.')[0].split('[')[0]}"
    )


def boolean_field(doc: dict[str, Any], name: str) -> bool | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, bool):
        raise field_error(name, "must be true or false")
    return value


def object_field(value: Any, name: str, *, required: bool = False) -> dict[str, Any] | None:
    if value is None and not required:
        return None
    if not isinstance(value, dict):
        raise field_error(name, "must be an object")
    return value


def string_field(
    value: Any, name: str, *, required: bool = False, max_length: int | None = None
) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (max_length is not None and len(value) > max_length):
        limit = f" of at most {max_length} characters" if max_length is not None else ""
        raise field_error(name, f"must be a string{limit}")
    return value


def options_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The sampling options every request type shares, and the checks of the other common fields."""
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):
        given = integer_field(doc, name, 1, MAX_TOKENS_LIMIT, code="invalid_max_tokens")
        max_tokens = given if given is not None else max_tokens
    n = integer_field(doc, "n", 1, MAX_N)
    for name in ("presence_penalty", "frequency_penalty"):
        _number(doc, name, -2.0, 2.0)
    integer_field(doc, "seed", *INT64)
    string_field(doc.get("user"), "user", max_length=USER_MAX_LENGTH)
    logit_bias = object_field(doc.get("logit_bias"), "logit_bias") or {}
    for key, bias in logit_bias.items():
        if not _is_number(bias) or not -100 <= bias <= 100:
            raise field_error(
                f"logit_bias.{param_segment(key)}", "must be a number from -100 to 100", "invalid_logit_bias"
            )
    return {
        "max_tokens": max_tokens,
        "temperature": _number(doc, "temperature", 0.0, 2.0),
        "top_p": _number(doc, "top_p", 0.0, 1.0),
        "stop": _stop(doc),
        "n": n or 1,
    }


def stream_fields(doc: dict[str, Any]) -> tuple[bool, bool]:
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false", param="stream", code="invalid_stream")
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest(
            "stream_options must be an object", param="stream_options", code="invalid_stream_options"
        )
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise InvalidRequest(
            "stream_options.include_usage must be true or false",
            param="stream_options.include_usage",
            code="invalid_stream_options",
        )
    return bool(stream), bool(include_usage)
