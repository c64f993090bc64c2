"""A data migration's test on an empty database of its own, migrated only as far as it needs.

Rolling the test database back to an old migration unapplies every later migration of every app
that depends on it, and the test must then apply them all again for the tests after it: 13 to
33 CPU-seconds per migration test here (by the sitting), almost all of it Django rendering the
project state at each step. An empty database beside the test database is migrated forward to the migration
before the one under test (only its ancestors), given old rows, and migrated one step on; it
is dropped afterwards, and the test database is never touched.

    def test_...(scratch_db: str) -> None:  # the fixture (tests/conftest.py) wraps scratch_database
        apps = migrate_to(scratch_db, BEFORE)
        ...old rows through apps.get_model(...), .objects.using(scratch_db)...
        apps = migrate_to(scratch_db, AFTER)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from tests.template_db import dsn


@contextmanager
def scratch_database(tmp_path: Path | None = None, *, migrated: bool = False) -> Iterator[str]:
    """The alias of a new database of the test database's engine, dropped on exit: empty, or
    with `migrated` at the latest migrations (on PostgreSQL a copy of the test run's migrated
    template, tests/template_db.py; otherwise migrated here).

    PostgreSQL: a database on the same server; SQLite: a file under tmp_path."""
    default = connections[DEFAULT_DB_ALIAS].settings_dict
    alias = f"scratch_{uuid.uuid4().hex[:10]}"
    postgres = default["ENGINE"].endswith("postgresql")
    template = (default.get("TEST") or {}).get("TEMPLATE") if migrated and postgres else None
    if postgres:
        name = f"{default['NAME'][:40]}_{alias}"
        with psycopg.connect(dsn(default, "postgres"), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    else:
        if tmp_path is None:
            raise ValueError("SQLite needs tmp_path for the scratch database's file")
        name = str(tmp_path / f"{alias}.sqlite3")
    connections.settings[alias] = {**default, "NAME": name, "TEST": {}}
    try:
        if migrated and not template:
            migrate_to(alias, *MigrationExecutor(connections[alias]).loader.graph.leaf_nodes())
        yield alias
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]
        if postgres:
            with psycopg.connect(dsn(default, "postgres"), autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate_to(alias: str, *targets: tuple[str, str]) -> Any:
    """Migrate the scratch database to `targets` (forwards: their ancestors only; backwards:
    unapplying everything that depends on them); the historical apps there.

    The default database refuses every query meanwhile, so a migration that reads or writes
    it instead of `schema_editor.connection.alias` fails here."""
    executor = MigrationExecutor(connections[alias])
    with _default_refused(alias):
        executor.migrate(list(targets))
    return executor.loader.project_state(list(targets)).apps


@contextmanager
def _default_refused(alias: str) -> Iterator[None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(
            f"a migration used the default database while {alias} was migrated: "
            "use Model.objects.using(schema_editor.connection.alias)"
        )

    # Every query opens its cursor through ensure_connection, connected or not.
    with mock.patch.object(connections[DEFAULT_DB_ALIAS], "ensure_connection", refuse):
        yield
