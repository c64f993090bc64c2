"""registry.claims, the one claim/lease helper of the job runners: racing claimants (real threads,
real connections, committed rows), stale and fresh leases, renewal and release."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone

from billing.models import ExportJob
from registry.claims import lease_claim, lease_release, lease_renew, row_claim

pytestmark = pytest.mark.django_db(transaction=True)

PENDING, RUNNING, DONE = ExportJob.Status.PENDING, ExportJob.Status.RUNNING, ExportJob.Status.SUCCEEDED
STALE = timedelta(minutes=5)
# The tests' rows: ExportJob's `status` is the state column, `started_at` stands for the heartbeat.
LEASE: dict[str, Any] = {"field": "status", "heartbeat": "started_at"}


def _race(claim: Callable[[], object], claimants: int = 4) -> list[object]:
    """Run `claim` in `claimants` threads at once (each on its own connection); their results."""
    results: list[object] = [None] * claimants
    errors: list[BaseException] = []
    start = threading.Barrier(claimants)

    def run(n: int) -> None:
        try:
            start.wait()
            results[n] = claim()
        except BaseException as exc:  # noqa: BLE001 (re-raised by the test below)
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(claimants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return results


def _job(**fields: Any) -> ExportJob:
    return ExportJob.objects.create(formats=["csv"], **fields)


def test_two_claimants_race_for_a_pending_row_and_exactly_one_wins() -> None:
    for _ in range(5):
        job = _job()
        won = _race(
            partial(
                row_claim,
                ExportJob,
                pk=job.pk,
                field="status",
                from_states=[PENDING],
                to_state=RUNNING,
                error="claimed",
            )
        )
        assert won.count(True) == 1
        assert won.count(False) == len(won) - 1
        job.refresh_from_db()
        assert (job.status, job.error) == (RUNNING, "claimed")


def test_a_claimed_row_is_not_claimed_again_and_a_missing_row_is_a_no_op() -> None:
    job = _job()
    assert row_claim(ExportJob, pk=job.pk, field="status", from_states=[PENDING], to_state=RUNNING)
    assert not row_claim(ExportJob, pk=job.pk, field="status", from_states=[PENDING], to_state=RUNNING)
    assert not row_claim(ExportJob, pk=job.pk + 1000, field="status", from_states=[PENDING], to_state=RUNNING)
    job.refresh_from_db()
    assert job.status == RUNNING


def test_a_pending_row_is_leased_with_the_heartbeat_as_its_token() -> None:
    job = _job()
    now = timezone.now()
    token = lease_claim(
        ExportJob, pk=job.pk, pending=PENDING, running=RUNNING, stale_after=STALE, now=now, **LEASE
    )
    assert token == now
    job.refresh_from_db()
    assert (job.status, job.started_at) == (RUNNING, now)


def test_a_stale_lease_is_taken_over_and_a_fresh_one_is_not() -> None:
    now = timezone.now()
    fresh = _job(status=RUNNING, started_at=now - STALE + timedelta(seconds=5))
    stale = _job(status=RUNNING, started_at=now - STALE - timedelta(seconds=5))
    no_heartbeat = _job(status=RUNNING, started_at=None)
    finished = _job(status=DONE, started_at=now - STALE * 10)

    def take(job: ExportJob) -> object:
        return lease_claim(
            ExportJob,
            pk=job.pk,
            pending=PENDING,
            running=RUNNING,
            stale_after=STALE,
            now=now,
            error="taken",
            row_count=F("row_count") + 1,
            **LEASE,
        )

    assert take(fresh) is None
    assert take(no_heartbeat) is None
    assert take(finished) is None
    assert take(stale) == now
    for job in (fresh, stale, no_heartbeat, finished):
        job.refresh_from_db()
    assert (stale.status, stale.started_at, stale.error, stale.row_count) == (RUNNING, now, "taken", 1)
    assert fresh.started_at == now - STALE + timedelta(seconds=5) and fresh.error == ""
    assert (no_heartbeat.started_at, finished.status) == (None, DONE)
    # Now fresh: a second taker finds it held.
    assert take(stale) is None


def test_two_claimants_race_for_a_stale_lease_and_exactly_one_takes_it() -> None:
    job = _job(status=RUNNING, started_at=timezone.now() - STALE * 2)
    tokens = _race(
        lambda: lease_claim(
            ExportJob, pk=job.pk, pending=PENDING, running=RUNNING, stale_after=STALE, **LEASE
        )
    )
    won = [t for t in tokens if t is not None]
    assert len(won) == 1
    job.refresh_from_db()
    assert job.started_at == won[0]


def test_renewal_is_a_compare_and_set_on_the_token_and_always_moves_it_forward() -> None:
    job = _job()
    token = lease_claim(ExportJob, pk=job.pk, pending=PENDING, running=RUNNING, stale_after=STALE, **LEASE)
    assert token is not None
    # A clock that did not move (or moved back) still yields a new token.
    renewed = lease_renew(
        ExportJob, pk=job.pk, states=[RUNNING], holder={"started_at": token}, now=token, row_count=7, **LEASE
    )
    assert renewed == token + timedelta(microseconds=1)
    # The old token lost the lease: the row is unchanged.
    assert (
        lease_renew(
            ExportJob, pk=job.pk, states=[RUNNING], holder={"started_at": token}, row_count=9, **LEASE
        )
        is None
    )
    job.refresh_from_db()
    assert (job.started_at, job.row_count) == (renewed, 7)


def test_a_heartbeat_without_a_token_renews_while_the_row_is_in_its_states() -> None:
    job = _job(status=RUNNING)
    beat = lease_renew(ExportJob, pk=job.pk, states=[RUNNING], **LEASE)
    assert beat is not None
    job.refresh_from_db()
    assert job.started_at == beat
    ExportJob.objects.filter(pk=job.pk).update(status=DONE)
    assert lease_renew(ExportJob, pk=job.pk, states=[RUNNING], **LEASE) is None


def test_release_moves_the_row_only_for_the_holder_of_the_token() -> None:
    job = _job()
    token = lease_claim(ExportJob, pk=job.pk, pending=PENDING, running=RUNNING, stale_after=STALE, **LEASE)
    assert token is not None
    later = token + timedelta(seconds=1)
    stale_token = token - timedelta(seconds=1)
    assert not lease_release(
        ExportJob, pk=job.pk, states=[RUNNING], to_state=DONE, holder={"started_at": stale_token}, **LEASE
    )
    assert lease_release(
        ExportJob,
        pk=job.pk,
        states=[RUNNING],
        to_state=DONE,
        holder={"started_at": token},
        now=later,
        finished_at=later,
        **LEASE,
    )
    job.refresh_from_db()
    assert (job.status, job.started_at, job.finished_at) == (DONE, later, later)
    # Released: a second release (a duplicate) does nothing.
    assert not lease_release(ExportJob, pk=job.pk, states=[RUNNING], to_state=PENDING, **LEASE)
