"""The request journal: answered requests whose ledger rows are still to be written.

Durability: in journal mode the request row is inserted, with its journal entry in
`ledger_pending`, by one autocommitted INSERT before the answer is sent. PostgreSQL has made it
durable (WAL fsync at COMMIT) when the INSERT returns, so a request the client saw answered
survives any crash from then on.

Exactly once: `journal_fold` locks pending rows (FOR UPDATE SKIP LOCKED, so folders in other
processes take other rows), writes their usage records, attempts and failover events and clears
`ledger_pending` in the same transaction. A crash before COMMIT leaves the rows pending for the
next fold; a crash after it leaves nothing to do. The ledger's idempotency keys
(`inference:<request>:<attempt>:<unit>`) would refuse a second copy in any case.

Bounded delay: each web process runs one folder thread, woken by every journaled request; it
waits INFERENCE_JOURNAL_FOLD_DELAY_SECONDS (50 ms) for more to arrive and folds them all in one
transaction, so the journal is folded within about that delay; when idle the thread
still looks every INFERENCE_JOURNAL_IDLE_SECONDS, so entries left by a process that died are
folded by any live one; the beat task `inference.journal_fold` does the same where no web
process runs. `manage.py journal status` shows what is pending and what failed.

An entry that cannot be folded (its price was deleted, say) is marked with the error and left
for an operator (`manage.py journal fold --retry-failed` after fixing the cause), so one bad
entry never holds up the others.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from billing.budgets import budget_holds_release
from inference.models import InferenceRequest

if TYPE_CHECKING:
    from inference.recording.fold import FoldJob

log = logging.getLogger(__name__)

FOLD_BATCH = 500


def _pending(*, retry_failed: bool = False):  # type: ignore[no-untyped-def]
    rows = InferenceRequest.objects.filter(ledger_pending__isnull=False)
    if not retry_failed:
        rows = rows.exclude(ledger_pending__has_key="error")
    return rows


def journal_fold(*, limit: int = FOLD_BATCH, retry_failed: bool = False) -> int:
    """Fold up to `limit` journaled requests into the ledger; returns how many were folded.

    The hard budgets' reservations the folded requests held are released once the fold has
    committed their spend (billing.budgets.budget_holds_release): until then they count twice,
    which errs on the side of refusing. An entry that cannot be folded keeps its holds."""
    folded = _fold_batch(limit=limit, retry_failed=retry_failed)
    budget_holds_release([hold for job in folded for hold in job.holds])
    return len(folded)


def _fold_batch(*, limit: int, retry_failed: bool) -> list[FoldJob]:
    """One transaction's fold (see journal_fold); the jobs it folded."""
    from inference.recording.fold import FoldJob, fold_jobs  # noqa: PLC0415 (fold imports billing's writers)

    # Not registry.claims: the fold picks up a batch of rows, not one row by id, and skips the
    # rows another folder holds (SKIP LOCKED) instead of waiting for them or taking them over;
    # the locks last the fold's transaction, so there is no lease to renew or to go stale.
    with transaction.atomic():
        rows = list(
            _pending(retry_failed=retry_failed)
            .order_by("pk")
            .select_for_update(skip_locked=True)
            .values_list("pk", "workflow_id", "created_at", "cost", "currency", "ledger_pending")[:limit]
        )
        if not rows:
            return []
        jobs = [
            FoldJob.from_journal(
                request_id=pk,
                workflow_id=workflow_id,
                created_at=created,
                cost=cost,
                currency=currency,
                doc=doc,
            )
            for pk, workflow_id, created, cost, currency, doc in rows
        ]
        try:
            with transaction.atomic():  # a savepoint: on failure the batch is retried one by one
                fold_jobs(jobs)
        except Exception:  # noqa: BLE001 (which entry is bad is found below; each keeps its own error)
            if len(jobs) == 1:
                _mark_failed(jobs[0].request_id, rows[0][5])
                return []
            folded = []
            for job, row in zip(jobs, rows, strict=True):
                try:
                    with transaction.atomic():
                        fold_jobs([job])
                    InferenceRequest.objects.filter(pk=job.request_id).update(ledger_pending=None)
                    folded.append(job)
                except Exception:  # noqa: BLE001 (recorded on the entry, logged, and skipped)
                    _mark_failed(job.request_id, row[5])
            return folded
        InferenceRequest.objects.filter(pk__in=[job.request_id for job in jobs]).update(ledger_pending=None)
    return jobs


def _mark_failed(request_id: int, doc: dict) -> None:  # type: ignore[type-arg]
    exc = sys.exc_info()[1]
    log.exception("journal entry of request %s could not be folded", request_id)
    marked = {**doc, "error": f"{type(exc).__name__}: {exc}"[:1000], "failed_at": timezone.now().isoformat()}
    InferenceRequest.objects.filter(pk=request_id).update(ledger_pending=marked)


def journal_fold_all(*, retry_failed: bool = False) -> int:
    """Fold until nothing (foldable) is pending; returns how many were folded."""
    total = 0
    while True:
        folded = journal_fold(retry_failed=retry_failed)
        total += folded
        if folded == 0:
            return total


def journal_pending_count() -> int:
    """How many entries wait to be folded (one count over the pending rows' partial index)."""
    return int(_pending().count())


def journal_status() -> dict[str, object]:
    """How many entries are pending, how many failed, and the oldest pending one's time."""
    pending = _pending()
    failed = InferenceRequest.objects.filter(ledger_pending__has_key="error")
    oldest: datetime | None = pending.order_by("pk").values_list("created_at", flat=True).first()
    return {
        "pending": journal_pending_count(),
        "failed": failed.count(),
        "oldest_pending_at": oldest.isoformat() if oldest else None,
        "predicted_cost_pending": str(sum(pending.values_list("cost", flat=True), Decimal(0))),
    }


class _Folder:
    """The folder thread of this process (one per process; restarted after a fork)."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def nudge(self) -> None:
        thread = self._thread
        if thread is None or self._pid != os.getpid() or not thread.is_alive():
            with self._lock:
                thread = self._thread
                if thread is None or self._pid != os.getpid() or not thread.is_alive():
                    self._pid = os.getpid()
                    self._wake = threading.Event()
                    self._stop = threading.Event()
                    self._thread = threading.Thread(target=self._run, name="journal-folder", daemon=True)
                    self._thread.start()
                    atexit.register(self.final_fold)
        self._wake.set()

    def _run(self) -> None:
        idle = settings.INFERENCE_JOURNAL_IDLE_SECONDS
        delay = settings.INFERENCE_JOURNAL_FOLD_DELAY_SECONDS
        wake, stop = self._wake, self._stop
        while not stop.is_set():
            if wake.wait(idle) and delay and not stop.is_set():
                # Let the requests of the next moments join this fold: a fold's cost is mostly
                # per transaction, so one per request (sequential traffic) would cost more CPU
                # than recording inline; under load the batches grow by themselves.
                time.sleep(delay)
            wake.clear()
            if stop.is_set():
                break
            if settings.INFERENCE_RECORDING != "journal":
                continue  # switched to inline recording (tests do): beat folds what is left
            try:
                journal_fold_all()
                # Keeps a persistent connection (CONN_MAX_AGE) open between folds, closes any other.
                connection.close_if_unusable_or_obsolete()
            except Exception:  # noqa: BLE001 (the thread must outlive a database outage; logged)
                log.exception("journal folder: fold failed; retrying shortly")
                connection.close()
                stop.wait(1.0)
        connection.close()  # stopped: this thread's connection must not hold the database open

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """End this process's folder thread (a fold under way finishes first), without the
        final fold at exit: for a caller whose database goes away before the process does (the
        test suite, where each test that journals leaves no folder behind it). A later nudge
        starts a new thread."""
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return
        self._stop.set()
        self._wake.set()
        thread.join(timeout_s)
        atexit.unregister(self.final_fold)
        self._thread = None

    def final_fold(self) -> None:
        """At a clean exit (gunicorn's graceful restart, a management command): fold what this
        process journaled rather than leave it to another process. A killed process skips
        this; its entries wait for the next fold anywhere."""
        if self._thread is None or self._pid != os.getpid() or settings.INFERENCE_RECORDING != "journal":
            return
        try:
            journal_fold_all()
        except Exception:  # noqa: BLE001 (exiting anyway; the entries stay pending, not lost)
            log.warning("journal folder: final fold failed; entries stay pending", exc_info=True)


_folder = _Folder()


def journal_nudge() -> None:
    """Wake this process's folder thread (starting it if needed): a request was journaled."""
    _folder.nudge()


def journal_folder_stop() -> None:
    """Stop this process's folder thread, if it runs (see _Folder.stop)."""
    _folder.stop()
