"""The checks every input passes where it enters: text, whole numbers, decimals, times,
currencies, JSON and YAML documents.

One function per kind of input, used by every boundary (the API's parser and fields, the pages'
forms, the file imports and the commands), so a kind of bad input is refused the same way
everywhere and before it reaches the database:

- text: NUL and the other control characters (tab, line feed and carriage return excepted) and
  unpaired surrogates are refused (PostgreSQL cannot store NUL; nothing here means the others);
- numbers are read from ASCII digits only (Python's int(), float() and Decimal() also take
  Arabic-Indic and other digits: "١٢" would become 12), ids within a bigint, decimals within
  their column's digits;
- times carry a UTC offset (or are read as UTC where a format says so) and must exist in UTC
  (0001-01-01T00:00:00+05:00 does not);
- currencies are ISO 4217 codes (pycountry's list);
- JSON and YAML documents are bounded in size, depth and node count, hold only JSON's types, and
  finite numbers (no NaN or Infinity, which no column or JSON document can hold).

Refusals raise InputError, a DomainError: the API answers 400 with the field's message, forms
show it on the field, commands print it as one line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml

from registry.errors import DomainError

BIGINT_MAX = 2**63 - 1  # PostgreSQL's bigint, SQLite's INTEGER; row ids and bigint columns
INTEGER_MAX = 2**31 - 1  # PostgreSQL's integer (PositiveIntegerField)
MAX_NUMBER_CHARS = 100  # a number's text; longer is not a number anyone means

MAX_JSON_DEPTH = 64  # objects and lists inside each other
MAX_DOCUMENT_NODES = 1_000_000  # values in one document (YAML aliases count each time)
MAX_CONFIG_BYTES = 1024 * 1024  # a training config (form, API field, command's file)


class InputError(DomainError, ValueError):
    """Input that cannot be taken as given; the message says why, `field` says where."""


class JSONSyntaxError(InputError):
    """Text that is not JSON; `reason`, `line` and `column` say where the parser stopped."""

    def __init__(self, reason: str, *, line: int, column: int) -> None:
        super().__init__(f"not valid JSON: {reason} (line {line}, column {column})")
        self.reason, self.line, self.column = reason, line, column


# --- Text ------------------------------------------------------------------------------------------

# C0 and C1 controls (tab, LF and CR excepted), DEL, and the surrogate range (a str holds one
# only when it came from an unpaired \ud800-style escape or surrogateescape decoding).
_REFUSED_CHARACTERS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why `value` cannot be stored as text, or None when it can."""
    found = _REFUSED_CHARACTERS.search(value)
    if found is None:
        return None
    char = found.group()
    kind = "an unpaired surrogate" if "\ud800" <= char <= "\udfff" else "a control character"
    return f"contains {kind} (U+{ord(char):04X}) at position {found.start() + 1}"


def text_check(value: str, *, field: str | None = None) -> str:
    """`value` unchanged, or InputError naming the first character that cannot be stored."""
    problem = text_problem(value)
    if problem is not None:
        raise InputError(problem, field=field)
    return value


# --- Whole numbers and ids ------------------------------------------------------------------------

_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


def int_parse(text: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """A whole number written in ASCII digits (an optional sign), within [minimum, maximum]."""
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS or not _INTEGER.fullmatch(stripped):
        if stripped and all(c.isdigit() or c in "+-" for c in stripped):
            raise InputError(f"write the number in ASCII digits 0-9: {_shown(text)}")
        raise InputError(f"not a whole number: {_shown(text)}")
    value = int(stripped)
    if minimum is not None and value < minimum:
        raise InputError(f"must be at least {minimum}: {_shown(text)}")
    if maximum is not None and value > maximum:
        raise InputError(f"must be at most {maximum}: {_shown(text)}")
    return value


def id_parse(text: object) -> int | None:
    """A row id (1 to bigint's maximum, ASCII digits) from text, or None when it cannot be one.

    For ids in paths, query strings and form fields: None means "no such row" (404), never a
    ValueError or an out-of-range query."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text if 1 <= text <= BIGINT_MAX else None
    if not isinstance(text, str):
        return None
    try:
        return int_parse(text, minimum=1, maximum=BIGINT_MAX)
    except InputError:
        return None


# --- Decimals -----------------------------------------------------------------------------------------


def decimal_check(
    value: Decimal,
    *,
    max_digits: int,
    decimal_places: int,
    minimum: Decimal | None = None,
    maximum: Decimal | None = None,
    round_excess: bool = False,
    shown: str | None = None,
) -> Decimal:
    """`value` if it fits a numeric(max_digits, decimal_places) column and the bounds (rounded
    half-even to the column's places when `round_excess`); InputError saying why it does not."""
    text = _shown(shown if shown is not None else str(value))
    if not value.is_finite():
        raise InputError(f"not a finite decimal: {text}")
    if minimum is not None and value < minimum:
        raise InputError(f"must not be negative: {text}" if minimum == 0 else f"must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InputError(f"must be at most {maximum}: {text}")
    if abs(value) >= Decimal(10) ** (max_digits - decimal_places):
        raise InputError(f"too large: {text} (at most {max_digits - decimal_places} digits before the point)")
    try:
        rounded = value.quantize(Decimal(1).scaleb(-decimal_places))
    except InvalidOperation:
        raise InputError(f"not a decimal: {text}") from None
    if rounded != value and not round_excess:
        raise InputError(f"more than {decimal_places} decimal places: {text}")
    return rounded if round_excess else value


def decimal_parse(
    text: str,
    *,
    max_digits: int,
    decimal_places: int,
    minimum: Decimal | None = None,
    maximum: Decimal | None = None,
    round_excess: bool = False,
) -> Decimal:
    """A decimal written in ASCII digits (sign, point and exponent allowed) that fits its column."""
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS or not _DECIMAL.fullmatch(stripped):
        try:
            other = Decimal(stripped)
        except (InvalidOperation, ValueError):
            raise InputError(f"not a decimal: {_shown(text)}") from None
        if not other.is_finite():
            raise InputError(f"not a finite decimal: {_shown(text)}")
        if len(stripped) > MAX_NUMBER_CHARS:
            raise InputError(f"too long for a number: {_shown(text)}")
        raise InputError(f"write the number in ASCII digits 0-9: {_shown(text)}")
    return decimal_check(
        Decimal(stripped),
        max_digits=max_digits,
        decimal_places=decimal_places,
        minimum=minimum,
        maximum=maximum,
        round_excess=round_excess,
        shown=text,
    )


def float_parse(text: str, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite float written in ASCII digits, within [minimum, maximum]."""
    stripped = text.strip()
    if len(stripped) > MAX_NUMBER_CHARS or not _DECIMAL.fullmatch(stripped):
        raise InputError(f"not a number in ASCII digits: {_shown(text)}")
    return float_check(float(stripped), minimum=minimum, maximum=maximum)


def float_check(value: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    if not math.isfinite(value):
        raise InputError(f"not a finite number: {value}")
    if minimum is not None and value < minimum:
        raise InputError(f"must be at least {minimum:g}")
    if maximum is not None and value > maximum:
        raise InputError(f"must be at most {maximum:g}")
    return value


# --- Times ---------------------------------------------------------------------------------------------


# The last day a datetime can hold is left out: code adds a day to a stored time (the end of
# its day, in reconciliation and the rollups), which must still exist.
LATEST_TIME = datetime(9999, 12, 31, tzinfo=UTC)  # exclusive
_TIME_RANGE = "0001-01-01 to 9999-12-30 in UTC"


def datetime_utc(value: datetime, *, naive_is_utc: bool = False) -> datetime:
    """An aware time converted to UTC; InputError when it has no offset (unless `naive_is_utc`)
    or falls outside the times that can be stored (an offset time at the first or last day a
    datetime can hold does not even exist in UTC)."""
    if value.tzinfo is None or value.utcoffset() is None:
        if not naive_is_utc:
            raise InputError(f"needs a UTC offset or Z: {_shown(value.isoformat())}")
        value = value.replace(tzinfo=UTC)
    try:
        converted = value.astimezone(UTC)
    except OverflowError:
        converted = LATEST_TIME
    if converted >= LATEST_TIME:
        raise InputError(f"outside the times that can be stored ({_TIME_RANGE}): {_shown(value.isoformat())}")
    return converted


def datetime_parse(text: str, *, naive_is_utc: bool = False) -> datetime:
    """An ISO 8601 time (ASCII digits) with a UTC offset or Z, in UTC.

    Without an offset: refused, or read as UTC with `naive_is_utc` (formats such as AWS CUR
    write UTC times without one)."""
    stripped = text.strip()
    if not stripped.isascii() or len(stripped) > MAX_NUMBER_CHARS:
        raise InputError(f"not an ISO 8601 time: {_shown(text)}")
    try:
        value = datetime.fromisoformat(stripped)
    except ValueError:
        raise InputError(f"not an ISO 8601 time: {_shown(text)}") from None
    if value.tzinfo is None and not naive_is_utc:
        raise InputError(f"needs a UTC offset or Z: {_shown(text)}")
    return datetime_utc(value, naive_is_utc=naive_is_utc)


def date_parse(text: str) -> date:
    """An ISO 8601 day (YYYY-MM-DD, ASCII digits) within the times that can be stored."""
    stripped = text.strip()
    if not stripped.isascii():
        raise InputError(f"not an ISO 8601 day (YYYY-MM-DD): {_shown(text)}")
    try:
        day = date.fromisoformat(stripped)
    except ValueError:
        raise InputError(f"not an ISO 8601 day (YYYY-MM-DD): {_shown(text)}") from None
    if day >= LATEST_TIME.date():
        raise InputError(f"outside the days that can be stored ({_TIME_RANGE}): {_shown(text)}")
    return day


# --- Currencies ------------------------------------------------------------------------------------------

_THREE_LETTERS = re.compile(r"[A-Za-z]{3}")


def currency_parse(text: str) -> str:
    """An ISO 4217 currency code ("usd" is read as USD); InputError otherwise."""
    code = text.strip()
    if not _THREE_LETTERS.fullmatch(code):
        raise InputError(f"must be three letters: {_shown(text)}")
    code = code.upper()
    # Imported here: the package costs about 0.1 s to import, which every process would pay at
    # start (it reads its database on the first lookup either way).
    import pycountry

    if pycountry.currencies.get(alpha_3=code) is None:
        raise InputError(f"not an ISO 4217 currency code: {_shown(text)}")
    return code


# --- JSON and YAML documents ---------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _path(parent: str, key: object) -> str:
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{parent}[{key}]" if parent else f"[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def document_check(
    value: Any, *, max_depth: int = MAX_JSON_DEPTH, max_nodes: int = MAX_DOCUMENT_NODES
) -> None:
    """Refuse (InputError, `field` the dotted path) a parsed document that is nested more than
    `max_depth` deep, has more than `max_nodes` values, holds anything but JSON's types
    (objects with string or integer keys, lists, strings, finite numbers, booleans, null) or
    text that cannot be stored. Iterative, so no document can exhaust the stack."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    nodes = 0
    while stack:
        item, path, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise InputError(f"more than {max_nodes} values in one document", field=path or None)
        if isinstance(item, dict | list):
            if depth >= max_depth:
                raise InputError(f"nested more than {max_depth} levels deep", field=path or None)
            if isinstance(item, list):
                stack.extend((v, _path(path, i), depth + 1) for i, v in enumerate(item))
                continue
            for key, v in item.items():
                if isinstance(key, str):
                    problem = text_problem(key)
                    if problem is not None:
                        raise InputError(f"a key {problem}", field=path or None)
                elif not isinstance(key, int) or isinstance(key, bool):
                    raise InputError(f"a key must be text, not {type(key).__name__}", field=path or None)
                stack.append((v, _path(path, key), depth + 1))
        elif isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                raise InputError(problem, field=path or None)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InputError(f"not a finite number: {item}", field=path or None)
        elif item is not None and not isinstance(item, bool | int):
            raise InputError(
                f"a {type(item).__name__} is not a JSON value (quote it to make it text)", field=path or None
            )


def json_parse(text: str | bytes, *, max_bytes: int | None = None, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON document, checked by document_check; InputError for anything else.

    NaN and Infinity are refused; a document nested past the parser's recursion limit is
    refused as too deep (never a RecursionError)."""
    if max_bytes is not None and len(text) > max_bytes:
        raise InputError(f"larger than {max_bytes} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(text.removeprefix("\ufeff"), parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise JSONSyntaxError(exc.msg, line=exc.lineno, column=exc.colno) from None
    except RecursionError:
        raise InputError(f"nested more than {max_depth} levels deep") from None
    except ValueError as exc:  # a NaN or Infinity constant, or an integer of thousands of digits
        raise InputError(f"not valid JSON: {exc}") from None
    document_check(value, max_depth=max_depth)
    return value


class _JsonTypesLoader(yaml.SafeLoader):
    """YAML's safe loader without the implicit timestamp type: a date stays text, as in JSON."""


_JsonTypesLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def yaml_parse(
    text: str,
    *,
    max_bytes: int = MAX_CONFIG_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    max_nodes: int = 100_000,
) -> Any:
    """A YAML document of JSON's types (a JSON document is one too), checked by document_check.

    `.nan` and `.inf` are refused, as are aliases that expand past `max_nodes` values."""
    if len(text) > max_bytes:
        raise InputError(f"larger than {max_bytes} bytes")
    try:
        value = yaml.load(text, Loader=_JsonTypesLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise InputError(f"nested more than {max_depth} levels deep") from None
    document_check(value, max_depth=max_depth, max_nodes=max_nodes)
    return value


def config_parse(text: str) -> Any:
    """A config written as JSON (when it starts with "{") or YAML, bounded as above."""
    parse: Callable[[str], Any] = (
        (lambda t: json_parse(t, max_bytes=MAX_CONFIG_BYTES)) if text.lstrip().startswith("{") else yaml_parse
    )
    return parse(text)
