"""The append-only usage ledger: pricing by version, exact amounts, idempotency, reversals."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, transaction

from billing.models import PriceBook, Unit, UsageRecord
from billing.rollups import rollups_update
from billing.selectors import price_in_force, spend_per_provider_per_day, spend_total
from billing.services import NoPriceError, price_book_publish, usage_record, usage_reverse
from registry.models import Cluster, ImmutableRowError
from tests.factories import api_client, make_cluster, make_deployment, make_price, make_provider

pytestmark = pytest.mark.django_db

JAN_1 = datetime(2026, 1, 1, tzinfo=UTC)
FEB_1 = datetime(2026, 2, 1, tzinfo=UTC)
HOUR = Decimal(3600)


def _bill(
    cluster: Cluster, *, seconds: str = "3600", at: datetime, key: str | None = None, **extra: object
) -> UsageRecord:
    return usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal(seconds) / HOUR,
        occurred_at=at,
        idempotency_key=key or f"test:{cluster.slug}:{at.isoformat()}:{seconds}",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
def cluster() -> Cluster:
    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal("1.10"), effective_from=JAN_1)
    return cluster


# --- Pricing ---------------------------------------------------------------------------------------


def test_a_record_is_priced_from_the_version_in_force_when_the_work_happened(cluster: Cluster) -> None:
    v1 = PriceBook.objects.get(cluster=cluster)
    january = _bill(cluster, at=JAN_1 + timedelta(days=14))
    v2 = price_book_publish(
        unit=Unit.ACCELERATOR_HOUR, unit_price=Decimal("2.50"), effective_from=FEB_1, cluster=cluster
    )
    assert (v1.version, v2.version) == (1, 2)

    # Billed after v2 was published, for work done before the change: still v1.
    late_january = _bill(cluster, at=FEB_1 - timedelta(seconds=1))
    february = _bill(cluster, at=FEB_1)

    assert (january.price_book, january.unit_price, january.amount) == (v1, Decimal("1.10"), Decimal("1.10"))
    assert (late_january.price_book, late_january.unit_price) == (v1, Decimal("1.10"))
    assert (february.price_book, february.unit_price, february.amount) == (
        v2,
        Decimal("2.50"),
        Decimal("2.50"),
    )

    january.refresh_from_db()
    assert (january.price_book_id, january.amount) == (v1.pk, Decimal("1.10"))


def test_the_amount_is_an_exact_decimal(cluster: Cluster) -> None:
    record = _bill(cluster, seconds="3.6", at=JAN_1 + timedelta(hours=1))
    record.refresh_from_db()
    assert record.quantity == Decimal("0.001")
    assert record.unit_price == Decimal("1.10")
    assert record.amount == Decimal("0.0011")
    assert isinstance(record.amount, Decimal)
    assert record.currency == "USD"
    assert record.provider == cluster.provider
    assert record.unit == Unit.ACCELERATOR_HOUR


def test_the_stored_amount_is_the_stored_quantity_times_the_stored_unit_price(cluster: Cluster) -> None:
    # 0.002 s is 5.5…e-7 h: the quantity rounds to 9 places, and the amount must
    # be computed from that rounded quantity, or an auditor's re-computation
    # (quantity × unit_price) differs from the ledger in the last place.
    price_book_publish(
        unit=Unit.ACCELERATOR_HOUR, unit_price=Decimal("2"), effective_from=FEB_1, cluster=cluster
    )
    record = _bill(cluster, seconds="0.002", at=FEB_1 + timedelta(hours=1))
    record.refresh_from_db()
    assert record.quantity == Decimal("0.000000556")
    assert record.amount == record.quantity * record.unit_price == Decimal("0.000001112")


def test_a_deployment_price_beats_its_providers_price_which_is_the_fallback() -> None:
    provider = make_provider()
    priced = make_deployment(provider=provider)
    unpriced = make_deployment(provider=provider)
    make_price(provider=provider, unit=Unit.REQUEST, unit_price=Decimal("0.01"), effective_from=JAN_1)
    make_price(deployment=priced, unit=Unit.REQUEST, unit_price=Decimal("0.002"), effective_from=JAN_1)

    own = usage_record(
        unit=Unit.REQUEST, quantity=Decimal(3), occurred_at=FEB_1, idempotency_key="r1",
        subject_type="request", subject_id="1", deployment=priced,
    )  # fmt: skip
    fallback = usage_record(
        unit=Unit.REQUEST, quantity=Decimal(3), occurred_at=FEB_1, idempotency_key="r2",
        subject_type="request", subject_id="2", deployment=unpriced,
    )  # fmt: skip
    assert (own.amount, own.provider, own.model) == (Decimal("0.006"), provider, priced.model)
    assert fallback.amount == Decimal("0.03")
    assert fallback.price_book.provider == provider


def test_the_same_idempotency_key_returns_the_same_row(cluster: Cluster) -> None:
    first = _bill(cluster, seconds="60", at=FEB_1, key="probe_job:7")
    again = _bill(cluster, seconds="999", at=FEB_1, key="probe_job:7")
    assert again.pk == first.pk
    assert again.quantity == first.quantity
    assert UsageRecord.objects.filter(idempotency_key="probe_job:7").count() == 1


def test_no_price_in_force_raises_and_writes_nothing() -> None:
    unpriced = make_cluster(price=None)
    with pytest.raises(NoPriceError, match=unpriced.slug):
        _bill(unpriced, at=FEB_1)
    later = make_cluster(price=None)
    make_price(cluster=later, unit_price=Decimal("1"), effective_from=FEB_1)
    with pytest.raises(NoPriceError):
        _bill(later, at=FEB_1 - timedelta(microseconds=1))
    assert not UsageRecord.objects.exists()


def test_a_price_for_another_unit_does_not_price_the_work(cluster: Cluster) -> None:
    with pytest.raises(NoPriceError):
        usage_record(
            unit=Unit.REQUEST, quantity=Decimal(1), occurred_at=FEB_1, idempotency_key="k",
            subject_type="t", subject_id="1", cluster=cluster,
        )  # fmt: skip
    assert price_in_force(unit=Unit.REQUEST, at=FEB_1, cluster=cluster) is None
    assert not UsageRecord.objects.exists()


@pytest.mark.parametrize(("quantity", "error"), [(Decimal("-1"), ValueError), (1.5, TypeError)])
def test_negative_or_float_quantities_are_refused(cluster: Cluster, quantity: object, error: type) -> None:
    with pytest.raises(error):
        usage_record(
            unit=Unit.ACCELERATOR_HOUR, quantity=quantity, occurred_at=FEB_1,  # type: ignore[arg-type]
            idempotency_key="k", subject_type="t", subject_id="1", cluster=cluster,
        )  # fmt: skip
    assert not UsageRecord.objects.exists()


def test_publishing_prices_numbers_versions_per_target_and_unit(cluster: Cluster) -> None:
    other = make_cluster(price=None)
    second = price_book_publish(
        unit=Unit.ACCELERATOR_HOUR, unit_price=Decimal("3"), effective_from=FEB_1, cluster=cluster
    )
    first_of_other = price_book_publish(
        unit=Unit.ACCELERATOR_HOUR, unit_price=Decimal("3"), effective_from=FEB_1, cluster=other
    )
    assert (second.version, first_of_other.version) == (2, 1)
    with pytest.raises(ValueError, match="negative"):
        price_book_publish(
            unit=Unit.ACCELERATOR_HOUR, unit_price=Decimal("-1"), effective_from=FEB_1, cluster=other
        )
    assert PriceBook.objects.count() == 3


# --- Append-only -------------------------------------------------------------------------------------


def test_the_orm_refuses_to_change_or_delete_a_record(cluster: Cluster) -> None:
    record = _bill(cluster, at=FEB_1)
    with pytest.raises(ImmutableRowError):
        UsageRecord.objects.filter(pk=record.pk).update(amount=Decimal("0"))
    with pytest.raises(ImmutableRowError):
        UsageRecord.objects.filter(pk=record.pk).delete()
    with pytest.raises(ImmutableRowError):
        UsageRecord.objects.all().delete()
    record.amount = Decimal("0")
    with pytest.raises(ImmutableRowError):
        record.save()
    with pytest.raises(ImmutableRowError):
        record.delete()
    stored = UsageRecord.objects.get(pk=record.pk)
    assert stored.amount == Decimal("1.10")


def _trigger_names() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'billing_usagerecord'::regclass AND NOT tgisinternal"
        )
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.postgres  # SQLite, the embedded default, has only the ORM guard (no trigger)
def test_the_database_refuses_raw_updates_and_deletes(cluster: Cluster) -> None:
    record = _bill(cluster, at=FEB_1)
    assert _trigger_names() == {"billing_usage_no_update_delete"}
    for sql in (
        "UPDATE billing_usagerecord SET amount = 0 WHERE id = %s",
        "DELETE FROM billing_usagerecord WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(sql, [record.pk])
    assert UsageRecord.objects.get(pk=record.pk).amount == Decimal("1.10")


# --- Reversals ---------------------------------------------------------------------------------------


def test_a_reversal_appends_a_negative_row_pointing_at_the_original(cluster: Cluster) -> None:
    original = _bill(cluster, seconds="7200", at=FEB_1)
    reversal = usage_reverse(record=original, reason="double-billed", occurred_at=FEB_1 + timedelta(days=1))
    assert reversal.pk != original.pk
    assert reversal.reverses == original
    assert (reversal.quantity, reversal.amount) == (-original.quantity, -original.amount)
    assert (reversal.unit_price, reversal.price_book, reversal.cluster) == (
        original.unit_price,
        original.price_book,
        cluster,
    )
    assert reversal.description == "reversal: double-billed"
    assert UsageRecord.objects.count() == 2
    assert spend_total() == Decimal("0")
    original.refresh_from_db()
    assert original.amount == Decimal("2.20")
    assert original.reversed_by == reversal


def test_reversing_twice_returns_the_same_reversal(cluster: Cluster) -> None:
    original = _bill(cluster, at=FEB_1)
    first = usage_reverse(record=original, reason="oops", occurred_at=FEB_1)
    again = usage_reverse(record=original, reason="oops again", occurred_at=FEB_1 + timedelta(hours=1))
    assert again.pk == first.pk
    assert UsageRecord.objects.count() == 2


def test_a_reversal_cannot_itself_be_reversed(cluster: Cluster) -> None:
    reversal = usage_reverse(record=_bill(cluster, at=FEB_1), reason="x", occurred_at=FEB_1)
    with pytest.raises(ValueError, match="reversal"):
        usage_reverse(record=reversal, reason="y", occurred_at=FEB_1)
    assert UsageRecord.objects.count() == 2


# --- Spend per provider per day ------------------------------------------------------------------------


def test_spend_is_grouped_by_utc_day_and_provider() -> None:
    a = make_cluster(price=None, provider=make_provider(slug="a-cloud"))
    b = make_cluster(price=None, provider=make_provider(slug="b-cloud"))
    for c in (a, b):
        make_price(cluster=c, unit_price=Decimal("1.000"), effective_from=JAN_1)
    march_1 = datetime(2026, 3, 1, tzinfo=UTC)
    _bill(a, seconds="3600", at=march_1 - timedelta(minutes=1))  # the day before: excluded by `since`
    _bill(a, seconds="3600", at=march_1 + timedelta(hours=1))
    _bill(a, seconds="1800", at=march_1 + timedelta(hours=23, minutes=59))
    _bill(a, seconds="900", at=march_1 + timedelta(days=1, minutes=1))  # 00:01 UTC on March 2
    _bill(b, seconds="7200", at=march_1 + timedelta(hours=12))
    _bill(b, seconds="3600", at=march_1 + timedelta(days=2))  # excluded by `until`

    rows = spend_per_provider_per_day(since_day=march_1.date(), until_day=date(2026, 3, 3))
    assert [(r.day, r.provider, r.currency, r.amount) for r in rows] == [
        (date(2026, 3, 1), "a-cloud", "USD", Decimal("1.5")),
        (date(2026, 3, 1), "b-cloud", "USD", Decimal("2")),
        (date(2026, 3, 2), "a-cloud", "USD", Decimal("0.25")),
    ]
    # The same figures once part of the ledger is folded into the rollups.
    rollups_update()
    _bill(b, seconds="1800", at=march_1 + timedelta(hours=13))  # the unfolded tail counts too
    rows = spend_per_provider_per_day(since_day=march_1.date(), until_day=date(2026, 3, 3))
    assert [(r.day, r.provider, r.amount) for r in rows] == [
        (date(2026, 3, 1), "a-cloud", Decimal("1.5")),
        (date(2026, 3, 1), "b-cloud", Decimal("2.5")),
        (date(2026, 3, 2), "a-cloud", Decimal("0.25")),
    ]


def test_a_reversal_cancels_spend_on_the_day_it_is_booked(cluster: Cluster) -> None:
    day = datetime(2026, 3, 1, 10, tzinfo=UTC)
    usage_reverse(record=_bill(cluster, at=day), reason="refund", occurred_at=day + timedelta(hours=1))
    rows = spend_per_provider_per_day(since_day=day.date())
    assert [(r.day, r.amount) for r in rows] == [(date(2026, 3, 1), Decimal("0"))]


# --- The ledger API ----------------------------------------------------------------------------------------


def test_the_ledger_api_lists_records_with_their_price_version_and_is_read_only(
    cluster: Cluster, auditor: User, admin_user: User
) -> None:
    record = _bill(cluster, seconds="3.6", at=FEB_1)
    client = api_client(auditor)
    body = client.get("/api/usage-records/", {"cluster": cluster.slug}).json()
    assert [(r["id"], r["amount"], r["unit_price"], r["price_book_version"]) for r in body["results"]] == [
        (record.pk, "0.001100000", "1.100000000", 1)
    ]
    assert client.get("/api/usage-records/", {"cluster": "other"}).json()["results"] == []
    admin = api_client(admin_user)
    assert admin.post("/api/usage-records/", {}, format="json").status_code == 405
    assert admin.delete(f"/api/usage-records/{record.pk}/").status_code == 405
    assert UsageRecord.objects.count() == 1


def test_only_an_admin_publishes_a_price_through_the_api(
    cluster: Cluster, operator: User, admin_user: User
) -> None:
    body = {
        "cluster": cluster.slug,
        "unit": "accelerator_hour",
        "unit_price": "1.25",
        "effective_from": "2026-03-01T00:00:00Z",
    }
    assert api_client(operator).post("/api/price-books/", body, format="json").status_code == 403
    response = api_client(admin_user).post("/api/price-books/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["version"] == 2
    assert PriceBook.objects.filter(cluster=cluster).count() == 2


def test_a_price_for_two_targets_or_none_is_400(cluster: Cluster, admin_user: User) -> None:
    deployment = make_deployment()
    client = api_client(admin_user)
    start = "2026-03-01T00:00:00Z"  # required: a price takes effect when its publisher says
    price = {"unit": "request", "unit_price": "1", "effective_from": start}
    both = {**price, "cluster": cluster.slug, "deployment": deployment.slug}
    neither = price
    negative = {**price, "cluster": cluster.slug, "unit_price": "-1"}
    for body, field in ((both, "cluster"), (neither, "cluster"), (negative, "unit_price")):
        response = client.post("/api/price-books/", body, format="json")
        assert response.status_code == 400
        assert field in response.json()
    assert PriceBook.objects.count() == 1
