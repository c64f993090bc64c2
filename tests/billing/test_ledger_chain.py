"""The ledger's hash chain: every row chained, tampering named by `ledger verify`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.utils import timezone

from billing.chain import CHAINED_FIELDS, GENESIS_HASH, chain_hash
from billing.models import LedgerHead, Unit, UsageRecord
from billing.selectors import ledger_verify
from billing.services import NoPriceError, UsageInput, usage_record, usage_record_batch, usage_reverse
from registry.models import Cluster
from registry.services import api_token_create
from tests.factories import make_cluster


def _bill(cluster: Cluster, key: str, seconds: int = 3600) -> UsageRecord:
    return usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal(seconds) / Decimal(3600),
        occurred_at=timezone.now() - timedelta(minutes=1),
        idempotency_key=key,
        subject_type="probe_job",
        subject_id=key,
        cluster=cluster,
    )


@contextmanager
def _behind_the_ledgers_back() -> Iterator[None]:
    """Raw SQL with PostgreSQL's append-only trigger off, as an attacker with DDL rights would."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Run the deferred foreign-key checks first: ALTER TABLE refuses to
            # run while this transaction still has them pending.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE billing_usagerecord DISABLE TRIGGER billing_usage_no_update_delete")
        try:
            yield
        finally:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "ALTER TABLE billing_usagerecord ENABLE TRIGGER billing_usage_no_update_delete"
                )


def _raw(sql: str, params: list[object]) -> None:
    with _behind_the_ledgers_back(), connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.mark.django_db
def test_each_record_links_to_the_previous_one_and_the_chain_verifies() -> None:
    cluster = make_cluster()
    rows = [_bill(cluster, f"k{i}") for i in range(5)]
    assert [r.sequence for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0].prev_hash == GENESIS_HASH
    assert all(b.prev_hash == a.row_hash for a, b in zip(rows, rows[1:], strict=False))
    assert len({r.row_hash for r in rows}) == 5
    head = LedgerHead.objects.get(partition="main")
    assert (head.last_sequence, head.last_hash) == (5, rows[-1].row_hash)
    result = ledger_verify()
    assert result.ok and result.rows_checked == 5


@pytest.mark.django_db
def test_a_row_changed_behind_the_orms_back_is_named_by_ledger_verify() -> None:
    cluster = make_cluster()
    rows = [_bill(cluster, f"k{i}") for i in range(4)]
    _raw("UPDATE billing_usagerecord SET amount = %s WHERE id = %s", [Decimal("0.01"), rows[2].pk])

    result = ledger_verify()
    assert not result.ok
    assert (result.first_bad_id, result.first_bad_sequence, result.rows_checked) == (rows[2].pk, 3, 2)
    assert "changed" in result.problem
    with pytest.raises(CommandError, match=rf"row id={rows[2].pk} sequence=3: .*changed"):
        call_command("ledger", "verify")


@pytest.mark.django_db
def test_a_deleted_row_shows_as_a_gap_and_a_cut_tail_against_the_head() -> None:
    cluster = make_cluster()
    rows = [_bill(cluster, f"k{i}") for i in range(4)]
    _raw("DELETE FROM billing_usagerecord WHERE id = %s", [rows[1].pk])
    result = ledger_verify()
    assert (result.ok, result.first_bad_id, result.first_bad_sequence) == (False, rows[2].pk, 3)
    assert "sequence 2 is missing" in result.problem

    _raw("DELETE FROM billing_usagerecord WHERE id IN (%s, %s, %s)", [rows[0].pk, rows[2].pk, rows[3].pk])
    _bill(cluster, "fresh")  # continues the chain from the head, sequence 5
    result = ledger_verify()
    assert not result.ok and "sequence 1 is missing" in result.problem


@pytest.mark.django_db
def test_ledger_verify_prints_a_summary_when_the_chain_is_intact(capsys: pytest.CaptureFixture[str]) -> None:
    _bill(make_cluster(), "only")
    call_command("ledger", "verify")
    assert "ledger main: 1 rows, chain intact" in capsys.readouterr().out


@pytest.mark.django_db
def test_a_batch_is_chained_in_order_idempotent_and_all_or_nothing() -> None:
    cluster, unpriced = make_cluster(price=Decimal("2.000000")), make_cluster(price=None)
    now = timezone.now()
    items = [
        UsageInput(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal("0.5"),
            occurred_at=now,
            idempotency_key=f"batch:{i}",
            subject_type="training_run",
            subject_id="7",
            cluster=cluster,
        )
        for i in range(300)
    ]
    rows = usage_record_batch(items=items)
    assert [r.sequence for r in rows] == list(range(1, 301))
    assert all(r.amount == Decimal("1.000000000") for r in rows)

    again = usage_record_batch(items=items[:10] + items[:1])
    assert [r.pk for r in again] == [r.pk for r in rows[:10]] + [rows[0].pk]
    assert UsageRecord.objects.count() == 300

    bad = [
        UsageInput(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal("1"),
            occurred_at=now,
            idempotency_key=f"mixed:{i}",
            subject_type="training_run",
            subject_id="8",
            cluster=unpriced if i == 5 else cluster,
        )
        for i in range(10)
    ]
    with pytest.raises(NoPriceError):
        usage_record_batch(items=bad)
    assert UsageRecord.objects.count() == 300
    assert LedgerHead.objects.get().last_sequence == 300
    assert ledger_verify().ok


@pytest.mark.django_db
def test_a_reversal_is_a_chained_row_pointing_at_what_it_cancels() -> None:
    original = _bill(make_cluster(), "to-cancel", seconds=7200)
    reversal = usage_reverse(record=original, reason="double billed", occurred_at=timezone.now())
    assert reversal.sequence == original.sequence + 1 and reversal.prev_hash == original.row_hash
    assert (reversal.amount, reversal.quantity) == (-original.amount, -original.quantity)
    assert reversal.price_book_id == original.price_book_id and reversal.reverses_id == original.pk
    assert ledger_verify().ok


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_from_several_connections_keep_every_chain_unbroken() -> None:
    cluster = make_cluster()
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(15):
                _bill(cluster, f"t{n}:{i}")
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert UsageRecord.objects.count() == 60
    # Writers spread over the partitions (settings.LEDGER_PARTITIONS): each chain is gapless.
    partitions = set(UsageRecord.objects.values_list("partition", flat=True))
    for partition in partitions:
        rows = UsageRecord.objects.filter(partition=partition)
        assert sorted(rows.values_list("sequence", flat=True)) == list(range(1, rows.count() + 1))
        assert ledger_verify(partition=partition).ok


@pytest.mark.django_db
@pytest.mark.postgres  # the database's check is PostgreSQL SQL
def test_the_python_and_database_checks_agree_on_awkward_rows() -> None:
    cluster = make_cluster()
    awkward = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("0.000000001"),
        occurred_at=timezone.now().replace(microsecond=7),
        idempotency_key="awk\\ward\x1fkey",
        subject_type="probe_job",
        subject_id="ünïcode ✓",
        cluster=cluster,
        description="back\\slash and \x1f separator",
    )
    usage_reverse(record=awkward, reason="zero-ish", occurred_at=timezone.now())
    _bill(cluster, "plain")
    methods = ["python", "sql"]
    assert all(ledger_verify(method=m).ok for m in methods)

    _raw(
        "UPDATE billing_usagerecord SET description = %s WHERE id = %s", ["back\\slash and \x1f", awkward.pk]
    )
    results = [ledger_verify(method=m) for m in methods]
    assert {(r.ok, r.first_bad_id, r.rows_checked, r.problem) for r in results} == {
        (False, awkward.pk, 0, "the row's fields no longer match its hash: it was changed")
    }


# A row as the ledger hashed it before rows named an API key: its hash, computed by that version
# of billing.chain, must not change, or every chain written before would stop verifying.
_OLD_FORMAT_ROW = {
    "partition": "main",
    "sequence": 1,
    "occurred_at": datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC),
    "subject_type": "inference_request",
    "subject_id": "42",
    "description": "chat via dep",
    "provider_id": 3,
    "cluster_id": None,
    "deployment_id": 7,
    "model_id": None,
    "workflow_id": 5,
    "team": "search",
    "quantity": Decimal("0.000007"),
    "unit": "input_tokens_1m",
    "unit_price": Decimal("1.5"),
    "amount": Decimal("0.0000105"),
    "currency": "USD",
    "price_book_id": 9,
    "reverses_id": None,
    "idempotency_key": "inference:42:0:in",
}
_OLD_FORMAT_HASH = "5798678ac2d97ae51b3abf945ab51768dfc4cbc98f1a69b27a8b03ff35852739"


def test_a_row_in_the_old_format_hashes_as_before_and_an_api_key_is_covered_only_when_set() -> None:
    assert chain_hash(_OLD_FORMAT_ROW, GENESIS_HASH) == _OLD_FORMAT_HASH
    assert chain_hash({**_OLD_FORMAT_ROW, "api_key_id": None}, GENESIS_HASH) == _OLD_FORMAT_HASH
    keyed = chain_hash({**_OLD_FORMAT_ROW, "api_key_id": 12}, GENESIS_HASH)
    assert keyed != _OLD_FORMAT_HASH
    assert keyed != chain_hash({**_OLD_FORMAT_ROW, "api_key_id": 13}, GENESIS_HASH)


@pytest.mark.django_db
@pytest.mark.postgres  # checks with the database's (PostgreSQL SQL) verifier as well
def test_old_rows_and_keyed_rows_verify_together_and_a_changed_api_key_is_named(operator: User) -> None:
    cluster = make_cluster()
    token, _ = api_token_create(user=operator, name="k")
    before = _bill(cluster, "before-keys")  # no key: hashed as every row was before keys
    keyed = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal(1),
        occurred_at=timezone.now() - timedelta(minutes=1),
        idempotency_key="keyed",
        subject_type="probe_job",
        subject_id="keyed",
        cluster=cluster,
        api_key_id=token.pk,
    )
    assert keyed.api_key_id == token.pk
    assert before.row_hash == chain_hash(
        {f: getattr(before, f) for f in CHAINED_FIELDS}, GENESIS_HASH
    )  # the fixed fields alone
    assert ledger_verify(method="sql").ok and ledger_verify(method="python").ok

    _raw("UPDATE billing_usagerecord SET api_key_id = %s WHERE id = %s", [token.pk + 1, keyed.pk])
    for method in ("sql", "python"):
        result = ledger_verify(method=method)
        assert not result.ok and result.first_bad_id == keyed.pk, method
    _raw("UPDATE billing_usagerecord SET api_key_id = %s WHERE id = %s", [token.pk, keyed.pk])
    _raw("UPDATE billing_usagerecord SET api_key_id = %s WHERE id = %s", [token.pk, before.pk])
    for method in ("sql", "python"):
        result = ledger_verify(method=method)
        assert not result.ok and result.first_bad_id == before.pk, method
