"""Each pytest-xdist worker's test database is a copy of one migrated template, not migrated anew.

Migrating an empty database takes 20 to 30 s here (every app's migrations, the content types
and permissions), and pytest-django does it once per worker. On PostgreSQL the first worker
instead migrates a template database once, under an advisory lock, and every worker's test
database is created from it (`CREATE DATABASE ... TEMPLATE`, a file copy of well under a second;
Django's migrate then finds nothing to do). The template's name carries a hash of every
migration file and of the locks (which pin the third-party apps' migrations), so a changed
migration builds a new template and the stale ones are dropped; an unchanged tree reuses the
template from the previous run.

SWITCHYARD_TEST_DB_TEMPLATE=0 turns it off (each worker migrates, as pytest-django does).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from django.db import connections

ROOT = Path(__file__).resolve().parents[1]


def _fingerprint() -> str:
    digest = hashlib.sha256()
    files = sorted(ROOT.glob("*/migrations/*.py")) + sorted(ROOT.glob("*/*/migrations/*.py"))
    for path in [*files, ROOT / "requirements.txt"]:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def dsn(settings_dict: dict[str, Any], dbname: str) -> str:
    parts = {
        "dbname": dbname,
        "user": settings_dict.get("USER") or "",
        "password": settings_dict.get("PASSWORD") or "",
        "host": settings_dict.get("HOST") or "",
        "port": str(settings_dict.get("PORT") or ""),
    }
    return " ".join(f"{k}='{v}'" for k, v in parts.items() if v)


def _url(settings_dict: dict[str, Any], dbname: str) -> str:
    user = settings_dict.get("USER") or ""
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{dbname}"


def _build(settings_dict: dict[str, Any], admin: psycopg.Connection[Any], name: str) -> None:
    """Migrate a fresh database under a temporary name, then give it the template's name (a
    crash midway leaves no half-built template behind under the real name)."""
    partial = f"{name}_partial"
    admin.execute(f'DROP DATABASE IF EXISTS "{partial}"')
    admin.execute(f'CREATE DATABASE "{partial}"')
    env = {**os.environ, "DATABASE_URL": _url(settings_dict, partial)}
    env.pop("PYTEST_XDIST_WORKER", None)
    subprocess.run(  # noqa: S603 (our own manage.py)
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v0"],
        env=env,
        check=True,
        cwd=ROOT,
    )
    admin.execute(f'ALTER DATABASE "{partial}" RENAME TO "{name}"')


def template_db_prepare() -> None:
    """Make sure the template exists and point the test database's creation at it."""
    settings_dict = connections["default"].settings_dict
    if not settings_dict["ENGINE"].endswith("postgresql"):
        return
    if os.environ.get("SWITCHYARD_TEST_DB_TEMPLATE", "1").strip() == "0":
        return
    prefix = f"test_{settings_dict['NAME']}_tpl_"
    name = prefix + _fingerprint()
    with psycopg.connect(dsn(settings_dict, "postgres"), autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(hashtext(%s))", [prefix])
        try:
            exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if exists is None:
                _build(settings_dict, admin, name)
                stale = admin.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
                    [prefix.replace("_", r"\_") + "%", name],
                ).fetchall()
                for (old,) in stale:
                    try:
                        admin.execute(f'DROP DATABASE IF EXISTS "{old}"')
                    except psycopg.Error:
                        pass  # in use by another run: the next build tries again
        finally:
            admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", [prefix])
    settings_dict.setdefault("TEST", {})["TEMPLATE"] = name
