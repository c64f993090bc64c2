"""Schemathesis fuzzes every /api/ operation of the live app with a bearer token of each role and
finds no server error and no answer outside the documented schema.

The app runs in pytest-django's live server on this run's database, seeded for each role with
one object of each kind, so that the ids and slugs Schemathesis puts in paths, query strings and
bodies name real objects half of the time (its dictionaries) and the requests reach the services
behind the validation. Schemathesis runs as its CLI in a subprocess (its pytest plugin does not
load on this pytest), one test per role (the admin's in two halves by path), so that
pytest-xdist runs them side by side, each against its own worker's server; each with a fixed
seed, no example database and one request at a time. The admin's run covers every operation;
another role's covers the operations stack.access lets it call (the role matrix proves that
every other operation refuses it, with the documented 403 body). Every role runs
the fuzzing phase (EXAMPLES cases per operation); the admin also runs the coverage
phase (every boundary value, wrong type and missing field of every parameter, deterministic),
with bodies in JSON only (tests/stack/api_fuzz/hooks.py says why). API_FUZZ_DEEP=1 (or a number
of examples) is a long run by hand: 50 examples, and the coverage phase for every role in every
media type:

    API_FUZZ_DEEP=50 .venv/bin/python -m pytest tests/stack/test_api_fuzz.py -s

Every check is on except four. `positive_data_acceptance` expects every schema-valid body to be
accepted, but valid-looking input is refused for reasons a schema cannot say (a slug naming no
provider, a period that ends before it starts, a name that is taken). `use_after_free` and
`ensure_resource_availability` need the stateful phase, which is off: it walks links between
operations that this schema does not declare. `negative_data_rejection` (a request that breaks
the schema must be refused) was tried and is off for what it flagged, all of it lenient by
design rather than wrong: DRF reads a JSON number as text (`"display_name": 0` is "0") and 0 or 1
as a boolean; read-only fields sent in a body are ignored; a form or multipart body carries no
types, a boolean left out of a form is false (an unticked checkbox) and a multipart body without
parts is no fields (an empty PATCH). The one real fault it found, a filter documented as an enum
that took any value (`?kind=` on failover events), is fixed and has its own test.
Celery messages are dropped (no broker is needed: the fuzzer only checks what the API answers),
and the object store is a temporary directory.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.servers import basehttp
from django.db import DEFAULT_DB_ALIAS, connections

from registry.services import api_token_create
from stack.celery import app as celery_app
from tests.factories import make_user
from tests.stack.api_fuzz import SHARDS, finish, seed_world, shard_filters, start

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# --- The live server --------------------------------------------------------------------------


class _OneRequestPerConnection(basehttp.ServerHandler):
    """Django's test server handler, closing the connection after every answer.

    wsgiref reads the next request of a kept-alive connection from whatever bytes follow the
    last one; a fuzzed request whose body it did not take whole (a chunked body, which it
    does not parse) leaves bytes that it then reads as a request line, and it answers that
    with an HTTP/0.9-style error page without a status line. Schemathesis reported that once
    as a "Network Error" of the next operation (a viewer's POST .../cancel/), an answer of
    this test's server and not of the app or of gunicorn, which ships. One request per
    connection keeps every fuzzed request's answer its own."""

    def cleanup_headers(self) -> None:
        self.headers["Connection"] = "close"
        super().cleanup_headers()


@pytest.fixture
def fast_live_server(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The live server, answering without Nagle's delay, one request per connection.

    wsgiref writes a response's headers and body in separate sends; with Nagle's algorithm on,
    the second waits for the client's delayed ACK (about 40 ms on Linux) on every request."""
    httpd = live_server.thread.httpd
    accept = httpd.get_request
    monkeypatch.setattr(basehttp, "ServerHandler", _OneRequestPerConnection)
    # Each connection is a server thread of its own that answers one request: close its
    # database connection when the request ends rather than leave one per thread open.
    monkeypatch.setitem(connections.settings[DEFAULT_DB_ALIAS], "CONN_MAX_AGE", 0)

    def get_request() -> tuple[socket.socket, Any]:
        conn, address = accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address

    httpd.get_request = get_request
    try:
        yield live_server.url
    finally:
        del httpd.get_request


@pytest.fixture
def dropped_tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Celery messages the requests sent, recorded by task name and not delivered anywhere."""
    sent: list[str] = []

    def send_task(name: str, *args: Any, **kwargs: Any) -> None:
        sent.append(name)

    monkeypatch.setattr(celery_app, "send_task", send_task)
    return sent


@pytest.mark.parametrize("shard", list(SHARDS))
def test_schemathesis_finds_no_server_error_or_schema_violation_for_the_role(
    shard: str,
    fast_live_server: str,
    dropped_tasks: list[str],
    settings: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    role, paths = SHARDS[shard]
    filters, selected = shard_filters(role, paths)
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    # Thousands of refused requests log a warning each; a server error's traceback (ERROR) is kept.
    caplog.set_level(logging.ERROR, logger="django.request")
    server_cpu = time.process_time()
    user = make_user(role, username=f"fuzz-{role.value}")
    world = seed_world(user, prefix=f"fz-{role.value}")
    _, token = api_token_create(user=user, name="fuzz")
    run = start(fast_live_server, token, role, world, tmp_path / role.value, filters)
    result = finish(run, deadline=time.monotonic() + 3600)
    server_cpu = time.process_time() - server_cpu

    # The figures a run by hand reports (pytest -s).
    print(
        shard,
        result.summary(),
        f"server {server_cpu:.0f} s CPU, {len(dropped_tasks)} Celery messages dropped",
    )
    # Every operation the shard selects was fuzzed. The admin's halves select 40 or more each,
    # and together (include and exclude of one pattern) every operation (109 today); another
    # role selects exactly the operations stack.access lets it call.
    assert result.operations == result.operations_selected, result.failure_report()
    assert result.operations_total >= 80, result.failure_report()
    if selected is None:
        assert 40 <= result.operations_selected < result.operations_total, result.failure_report()
    else:
        assert 20 <= result.operations_selected == selected, result.failure_report()
    assert not (result.failures or result.errors), result.failure_report()
