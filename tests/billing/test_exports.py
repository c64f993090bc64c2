"""Cost-audit exports: exact sums, exact Decimals in every format, filters, streaming, and who may export."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from billing.exports import (
    CHUNK_ROWS,
    COLUMNS,
    ExportFilterError,
    ExportFilters,
    csv_chunks,
    export_filters_parse,
    export_rows,
    export_stream,
    export_write_files,
)
from billing.models import DailyRollup, Unit, UsageRecord
from billing.rollups import rollups_update
from billing.selectors import spend_per_provider_per_day
from billing.services import UsageInput, usage_record_batch, usage_reverse
from registry.models import Cluster, Deployment, Workflow
from tests.factories import (
    api_client,
    make_cluster,
    make_deployment,
    make_price,
    make_provider,
    make_workflow,
)

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 5, 4, 9, tzinfo=UTC)
Q9 = Decimal("0.000000001")


@dataclass
class Ledger:
    usd_cluster: Cluster
    eur_cluster: Cluster
    deployment: Deployment
    workflow: Workflow


def _bill(cluster: Cluster, n: int, *, key: str, quantity: str = "0.333333333", **extra: Any) -> None:
    usage_record_batch(
        items=[
            UsageInput(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal(quantity),
                occurred_at=DAY + timedelta(hours=i % 40),  # spans two UTC days and the price change
                idempotency_key=f"{key}:{i}",
                subject_type="training_run",
                subject_id=f"run-{i % 2}",
                cluster=cluster,
                **extra,
            )
            for i in range(n)
        ]
    )


@pytest.fixture
def ledger(operator: User) -> Ledger:
    """Two currencies, a price change half-way, inference tokens on a workflow, and a reversal."""
    usd = make_cluster(slug="usd-rack", price=None, provider=make_provider(slug="lab", display_name="Lab"))
    eur = make_cluster(slug="eur-rack", price=None, provider=make_provider(slug="euro", display_name="Euro"))
    make_price(cluster=usd, unit_price=Decimal("1.100000"), effective_from=DAY - timedelta(days=2))
    make_price(cluster=usd, unit_price=Decimal("1.370000001"), effective_from=DAY + timedelta(hours=20))
    make_price(cluster=eur, unit_price=Decimal("0.7"), currency="EUR", effective_from=DAY - timedelta(days=2))
    deployment = make_deployment(slug="chat-dep")
    make_price(deployment=deployment, unit=Unit.OUTPUT_TOKENS_1M, unit_price=Decimal("0.6"),
               effective_from=DAY - timedelta(days=2))  # fmt: skip
    workflow = make_workflow(owner=operator, deployments=[deployment], slug="chat", team="search")
    _bill(usd, 30, key="usd")
    rows = UsageRecord.objects.order_by("sequence")
    usage_reverse(record=rows[4], reason="double billed", occurred_at=DAY + timedelta(hours=3))
    rollups_update()  # part folded into rollups, the rest stays in the ledger tail
    _bill(eur, 25, key="eur", quantity="1.5")
    usage_record_batch(
        items=[
            UsageInput(unit=Unit.OUTPUT_TOKENS_1M, quantity=Decimal("0.000123457"), occurred_at=DAY + timedelta(minutes=i),
                       idempotency_key=f"req:{i}", subject_type="inference_request", subject_id=str(i),
                       deployment=deployment, workflow=workflow)
            for i in range(7)
        ]
    )  # fmt: skip
    return Ledger(usd, eur, deployment, workflow)


def _csv_rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode())))


def _totals(rows: list[dict[str, str]]) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = {}
    for row in rows:
        totals[row["BillingCurrency"]] = totals.get(row["BillingCurrency"], Decimal(0)) + Decimal(
            row["BilledCost"]
        )
    return totals


def test_an_export_sums_to_the_dashboard_and_the_rollups_to_the_cent_across_currencies_and_a_price_change(
    ledger: Ledger, auditor: User, tmp_path: Path
) -> None:
    start, end = DAY.replace(hour=0), DAY.replace(hour=0) + timedelta(days=3)
    response = api_client(auditor).get(
        "/api/usage-export/", {"format": "csv", "start": start.isoformat(), "end": end.isoformat()}
    )
    assert response.status_code == 200
    exported = _totals(_csv_rows(b"".join(response.streaming_content)))

    dashboard: dict[str, Decimal] = {}
    for spend in spend_per_provider_per_day(since_day=start.date(), until_day=end.date()):
        dashboard[spend.currency] = dashboard.get(spend.currency, Decimal(0)) + spend.amount
    rollups_update()
    rolled: dict[str, Decimal] = {}
    for rollup in DailyRollup.objects.all():
        rolled[rollup.currency] = rolled.get(rollup.currency, Decimal(0)) + rollup.amount

    assert set(exported) == {"USD", "EUR"}
    assert exported == dashboard == rolled
    # Both prices of the USD cluster are in it, each row at the version that priced it.
    assert set(
        UsageRecord.objects.filter(cluster=ledger.usd_cluster).values_list("unit_price", flat=True)
    ) == {
        Decimal("1.1"),
        Decimal("1.370000001"),
    }
    manifest = export_write_files(
        filters=ExportFilters(start=start, end=end), formats=["jsonl"], directory=tmp_path
    )
    assert manifest["totals"] == {
        currency: format(total, "f") for currency, total in sorted(exported.items())
    }


def test_each_format_round_trips_exact_decimals(ledger: Ledger, tmp_path: Path) -> None:
    manifest = export_write_files(
        filters=ExportFilters(), formats=["csv", "jsonl", "parquet"], directory=tmp_path
    )
    records = {r.pk: r for r in UsageRecord.objects.select_related("price_book")}
    assert manifest["row_count"] == len(records) == 63

    with (tmp_path / "usage.csv").open(newline="") as fh:
        from_csv = list(csv.DictReader(fh))
    from_jsonl = [json.loads(line) for line in (tmp_path / "usage.jsonl").read_text().splitlines()]
    table = pq.read_table(tmp_path / "usage.parquet")
    assert table.schema.field("BilledCost").type == pa.decimal128(28, 9)
    from_parquet = table.to_pylist()
    assert [list(r) for r in (from_csv[0], from_jsonl[0], from_parquet[0])] == [list(COLUMNS)] * 3

    for text_rows in (from_csv, from_jsonl):
        for row in text_rows:
            record = records[int(row["x_UsageRecordId"])]
            assert row["BilledCost"] == format(record.amount.quantize(Q9), "f")
            assert row["ListUnitPrice"] == format(record.unit_price.quantize(Q9), "f")
            assert row["PricingQuantity"] == format(record.quantity.quantize(Q9), "f")
            assert row["x_RowHash"] == record.row_hash
    for row in from_parquet:
        record = records[row["x_UsageRecordId"]]
        assert isinstance(row["BilledCost"], Decimal)
        assert (row["BilledCost"], row["ListUnitPrice"], row["PricingQuantity"]) == (
            record.amount,
            record.unit_price,
            record.quantity,
        )
        assert row["x_PriceBookVersion"] == record.price_book.version
    # A tiny inference charge survives to the last of its nine decimal places.
    tokens = next(r for r in from_jsonl if r["x_Unit"] == Unit.OUTPUT_TOKENS_1M)
    assert tokens["BilledCost"] == "0.000074074"
    # FOCUS Tags: keys with values only (no training run here, so no training_run key).
    assert tokens["Tags"] == {"subject": "inference_request:0", "team": "search", "workflow": "chat"}
    assert (tokens["ServiceName"], tokens["ResourceId"], tokens["ResourceType"]) == (
        "Model inference",
        "chat-dep",
        "deployment",
    )
    # Accelerator-hours: the charge period ends when the work was billed and lasts its hours.
    hours = next(r for r in from_jsonl if r["x_Unit"] == Unit.ACCELERATOR_HOUR and r["x_Sequence"] == 2)
    assert (hours["ChargePeriodStart"], hours["ChargePeriodEnd"]) == (
        "2026-05-04T09:40:00Z",  # FOCUS times are whole seconds: the start rounds down
        "2026-05-04T10:00:00Z",
    )
    assert hours["x_OccurredAt"] == "2026-05-04T10:00:00.000000Z"
    # Merged by time: occurred_at, then partition and sequence.
    in_time_order = sorted(records.values(), key=lambda r: (r.occurred_at, r.partition, r.sequence))
    assert [r["x_Sequence"] for r in from_parquet] == [r.sequence for r in in_time_order]


def _ids(**filters: Any) -> set[int]:
    return {row[COLUMNS.index("x_UsageRecordId")] for row in export_rows(filters=ExportFilters(**filters))}


def test_filters_select_exactly_the_matching_rows(ledger: Ledger) -> None:
    rows = UsageRecord.objects.all()

    def expect(**lookups: Any) -> set[int]:
        return set(rows.filter(**lookups).values_list("id", flat=True))

    assert _ids() == expect()
    assert _ids(provider="euro") == expect(provider__slug="euro") != set()
    assert _ids(cluster="usd-rack") == expect(cluster=ledger.usd_cluster) != set()
    assert _ids(workflow="chat") == expect(workflow=ledger.workflow) != set()
    assert _ids(team="search") == expect(team="search") != set()
    assert _ids(training_run="run-1") == expect(subject_type="training_run", subject_id="run-1") != set()
    assert _ids(unit=Unit.OUTPUT_TOKENS_1M) == expect(unit=Unit.OUTPUT_TOKENS_1M) != set()
    window = {"start": DAY + timedelta(hours=5), "end": DAY + timedelta(hours=21)}
    assert _ids(**window) == expect(occurred_at__gte=window["start"], occurred_at__lt=window["end"]) != set()
    assert _ids(provider="euro", unit=Unit.OUTPUT_TOKENS_1M) == set()
    # Pinned to a head sequence: rows appended later are not part of the export.
    assert _ids(through=(("main", 10),)) == expect(sequence__lte=10)


def test_bad_filters_name_each_field_and_good_ones_parse() -> None:
    with pytest.raises(ExportFilterError) as raised:
        export_filters_parse(
            params={"start": "yesterday", "provider": "nope", "unit": "bogus", "provder": "typo"}
        )
    errors = raised.value.errors
    assert set(errors) == {"start", "provider", "unit", "provder"}
    assert errors["provider"] == ["no provider with slug nope"]
    assert "unknown filter" in errors["provder"][0]
    with pytest.raises(ExportFilterError) as raised:
        export_filters_parse(params={"start": "2026-05-02", "end": "2026-05-01T00:00:00Z"})
    assert raised.value.errors == {"end": ["end must be after start"]}
    filters = export_filters_parse(params={"start": "2026-05-01", "end": "2026-05-02T12:00:00+02:00"})
    assert (filters.start, filters.end) == (
        datetime(2026, 5, 1, tzinfo=UTC),
        datetime(2026, 5, 2, 10, tzinfo=UTC),
    )


def test_streaming_twenty_thousand_rows_yields_every_row_without_building_a_list(auditor: User) -> None:
    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal("2.5"), effective_from=DAY - timedelta(days=1))
    _bill(cluster, 20_000, key="big", quantity="0.01")

    response = api_client(auditor).get("/api/usage-export/", {"format": "jsonl"})
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"].startswith('attachment; filename="switchyard-usage-')
    content = response.streaming_content
    assert isinstance(content, Iterator)  # a generator, not a list built up front
    chunks = rows = 0
    total = Decimal(0)
    for chunk in content:
        chunks += 1
        for line in chunk.splitlines():
            rows += 1
            total += Decimal(json.loads(line)["BilledCost"])
    assert rows == 20_000
    assert chunks >= 20_000 // CHUNK_ROWS
    assert total == Decimal("500.000000000")


def test_the_usage_export_api_answers_401_without_a_token_403_to_a_viewer_and_400_naming_bad_fields(
    ledger: Ledger, viewer: User, auditor: User
) -> None:
    assert APIClient().get("/api/usage-export/").status_code == 401
    assert api_client(viewer).get("/api/usage-export/").status_code == 403
    bad = api_client(auditor).get(
        "/api/usage-export/", {"format": "xml", "start": "2026-05-03", "end": "2026-05-01", "cluster": "nope"}
    )
    assert bad.status_code == 400
    assert bad.json() == {
        "format": ["unknown format 'xml'; one of csv, jsonl, parquet"],
        "end": ["end must be after start"],
        "cluster": ["no cluster with slug nope"],
    }
    good = api_client(auditor).get("/api/usage-export/", {"format": "csv", "provider": "euro"})
    rows = _csv_rows(b"".join(good.streaming_content))
    assert len(rows) == 25 and {r["ProviderName"] for r in rows} == {"Euro"}


def test_a_parquet_download_comes_from_a_temporary_file(ledger: Ledger, auditor: User) -> None:
    response = api_client(auditor).get(
        "/api/usage-export/", {"format": "parquet", "unit": "output_tokens_1m"}
    )
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(b"".join(response.streaming_content)))
    assert table.num_rows == 7
    assert sum(table.column("BilledCost").to_pylist()) == Decimal("0.000518518")


def test_the_export_page_shows_form_errors_and_downloads_for_ledger_readers_only(
    ledger: Ledger, auditor: User, viewer: User
) -> None:
    page = Client()
    page.force_login(auditor)
    assert "Cost-audit export" in page.get("/billing/export/").content.decode()
    bad = page.post("/billing/export/", {"start": "2026-05-03", "end": "2026-05-01", "format": "csv"})
    assert bad.status_code == 400
    assert 'id="errors-end"' in bad.content.decode() and "end must be after start" in bad.content.decode()
    download = page.post(
        "/billing/export/", {"start": "2026-05-01", "workflow": "chat", "format": "csv", "action": "download"}
    )
    assert download.status_code == 200 and download.streaming
    assert download["Content-Disposition"].startswith("attachment;")
    assert len(_csv_rows(b"".join(download.streaming_content))) == 7

    outsider = Client()
    outsider.force_login(viewer)
    assert outsider.get("/billing/export/").status_code == 403
    assert outsider.post("/billing/export/", {"format": "csv"}).status_code == 403


def test_the_streamed_csv_holds_the_same_rows_as_the_python_writer(ledger: Ledger) -> None:
    """On PostgreSQL the streamed CSV is written by the database (COPY); it must say the same."""
    filters = export_filters_parse(params={}).pinned()
    streamed = _csv_rows(b"".join(export_stream(filters=filters, fmt="csv")))
    reference = _csv_rows(b"".join(csv_chunks(export_rows(filters=filters))))
    assert len(streamed) == len(reference) == UsageRecord.objects.count()
    for got, want in zip(streamed, reference, strict=True):
        assert {k: v for k, v in got.items() if k != "Tags"} == {k: v for k, v in want.items() if k != "Tags"}
        assert json.loads(got["Tags"]) == json.loads(want["Tags"])
    accelerator = next(r for r in streamed if r["x_Unit"] == "accelerator_hour")
    assert accelerator["ChargePeriodStart"] < accelerator["ChargePeriodEnd"]
