"""A faster end for transactional tests on PostgreSQL: empty only the tables a test wrote.

Django ends every `transaction=True` test (TransactionTestCase) by flushing the database: one
TRUNCATE of all of the project's tables (about 75), which makes new files for every table and
index, then the post_migrate signal, which checks and re-creates every content type and
permission. That cost 0.5 to 2.5 s per test here, a quarter of the suite's time (385 s of 1,550 s
measured in one run), while a test writes to a handful of tables.

`flush_written_tables` does less: one query finds the tables that hold rows, and a DELETE
empties each of them, in one transaction with `session_replication_role = replica` so that
foreign-key and append-only triggers (the ledger's, the audit trail's) stand aside as they do for
TRUNCATE. The content types and permissions that migrate created stay, so post_migrate has
nothing to re-create and is not sent. The rows that data migrations wrote (the roles' groups,
the ledger's first head) are put back from a copy taken once after migrate, so every test, in
whatever order pytest-xdist runs it, starts from the migrated database: Django's flush leaves
them gone for every test that follows a transactional one. It needs a superuser (replication
role), as the test databases here have; elsewhere Django's own flush runs.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, transaction
from django.test import TransactionTestCase

# Rows that post_migrate would write again straight after a flush: left in place instead.
KEPT = frozenset({"django_content_type", "auth_permission"})
# Where remember_seeded_rows keeps a copy of the rows that migrations wrote (roles' groups, the
# ledger's first head): a schema of the test database that no model maps.
SEED_SCHEMA = "test_seed"

_django_fixture_teardown = TransactionTestCase._fixture_teardown
_superuser: dict[str, bool] = {}
_seeded: dict[str, list[str]] = {}


def _is_superuser(alias: str) -> bool:
    if alias not in _superuser:
        connection = connections[alias]
        if connection.vendor != "postgresql":
            _superuser[alias] = False
        else:
            with connection.cursor() as cursor:
                cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
                row = cursor.fetchone()
            _superuser[alias] = bool(row and row[0])
    return _superuser[alias]


def _tables(alias: str) -> list[str]:
    connection = connections[alias]
    names = connection.introspection.django_table_names(only_existing=True, include_views=False)
    return sorted(set(names) - KEPT)


def _holding_rows(cursor: Any, tables: list[str], quote: Any) -> list[str]:
    """The tables of `tables` that hold at least one row, in one query."""
    if not tables:
        return []
    probe = " UNION ALL ".join(
        f"SELECT {index} WHERE EXISTS (SELECT 1 FROM {quote(table)})"  # noqa: S608 (Django's table names)
        for index, table in enumerate(tables)
    )
    cursor.execute(probe)
    return [tables[index] for (index,) in cursor.fetchall()]


def remember_seeded_rows(alias: str) -> list[str]:
    """Copy the rows that migrations wrote into SEED_SCHEMA (once, right after the test database
    is made); the flush puts them back, so that every test starts from the migrated state."""
    if not _is_superuser(alias):
        return []
    connection = connections[alias]
    quote = connection.ops.quote_name
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        cursor.execute(f"DROP SCHEMA IF EXISTS {SEED_SCHEMA} CASCADE")
        cursor.execute(f"CREATE SCHEMA {SEED_SCHEMA}")
        seeded = _holding_rows(cursor, _tables(alias), quote)
        for table in seeded:
            cursor.execute(f"CREATE TABLE {SEED_SCHEMA}.{quote(table)} AS SELECT * FROM {quote(table)}")  # noqa: S608
    _seeded[alias] = seeded
    return seeded


def flush_written_tables(alias: str) -> list[str]:
    """Empty every project table that holds rows (except KEPT) and put the migrations' rows back;
    return the tables emptied."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    seeded = _seeded.get(alias, [])
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        written = sorted(set(_holding_rows(cursor, _tables(alias), quote)) | set(seeded))
        if written:
            # LOCAL: only this transaction runs without triggers (foreign keys, append-only guards).
            cursor.execute("SET LOCAL session_replication_role = replica")
            for table in written:
                cursor.execute(f"DELETE FROM {quote(table)}")  # noqa: S608 (Django's table names)
            for table in seeded:
                cursor.execute(f"INSERT INTO {quote(table)} SELECT * FROM {SEED_SCHEMA}.{quote(table)}")  # noqa: S608
    return written


def _fixture_teardown(self: TransactionTestCase) -> None:
    aliases = list(self._databases_names(include_mirrors=False))  # type: ignore[attr-defined]
    fast = all(_is_superuser(alias) for alias in aliases)
    if not fast or self.serialized_rollback or self.reset_sequences or self.available_apps is not None:
        _django_fixture_teardown(self)
        return
    for alias in aliases:
        flush_written_tables(alias)


def install() -> None:
    """Replace TransactionTestCase's teardown for this test process (pytest-django uses it)."""
    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[method-assign]


def installed() -> bool:
    return TransactionTestCase._fixture_teardown is _fixture_teardown


def seeded_tables(alias: str) -> list[str]:
    return list(_seeded.get(alias, []))
