"""Helpers shared by tests of every app (data builders live in tests/factories.py)."""

from __future__ import annotations

import time

from inference.recording import journal_fold_all, journal_status

LEDGER_SETTLE_TIMEOUT_S = 30.0
# In-process tests' password hasher (PBKDF2's 10^6 rounds cost about 0.2 s per user).
FAST_PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def ledger_settled(*, timeout_s: float = LEDGER_SETTLE_TIMEOUT_S) -> None:
    """Fold the request journal now, as the folder thread would moments later, so that a test
    reads what the fold writes for the requests it has made: ledger rows, attempts, failover
    events, kept prompts.

    On PostgreSQL requests are journaled as in production (inference.recording.journal); on
    SQLite, or inside a test's transaction, they are written inline and there is nothing to
    fold. Entries another folder holds (a server process's, SKIP LOCKED) are waited for; an
    entry that could not be folded fails the test with its error."""
    deadline = time.monotonic() + timeout_s
    while True:
        journal_fold_all()
        status = journal_status()
        if status["failed"]:
            raise AssertionError(f"journal entries could not be folded: {status}")
        if not status["pending"]:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"journal entries still pending after {timeout_s} s: {status}")
        time.sleep(0.02)
