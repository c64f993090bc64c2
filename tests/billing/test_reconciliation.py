"""Reconciliation: an invoice CSV against the ledger, per day and resource or service, with drill-down."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from billing.focus import focus_resource
from billing.models import InvoiceImport, InvoiceLine, Unit, UsageRecord
from billing.price_import import FileImportError
from billing.reconciliation import (
    ReconciliationCell,
    reconciliation_cell_rows,
    reconciliation_import,
    reconciliation_result,
)
from billing.rollups import rollups_update
from billing.services import UsageInput, usage_record_batch
from registry.auth.roles import Role
from tests.factories import api_client, make_cluster, make_deployment, make_price, make_provider, make_user

pytestmark = pytest.mark.django_db

MAY_4, MAY_5 = date(2026, 5, 4), date(2026, 5, 5)
CUR = "lineItem/UsageStartDate,lineItem/ProductCode,lineItem/ResourceId,lineItem/UsageAmount,lineItem/UnblendedCost,lineItem/CurrencyCode\n"  # noqa: E501
CUR2 = "line_item_usage_start_date,line_item_product_code,line_item_resource_id,line_item_usage_amount,line_item_unblended_cost,line_item_currency_code\n"  # noqa: E501


class Stack:
    def __init__(self) -> None:
        self.provider = make_provider(slug="aws-main")
        self.cluster = make_cluster(price=None, slug="gpu-east", provider=self.provider)
        self.deployment = make_deployment(slug="chat", provider=self.provider)
        since = datetime(2026, 1, 1, tzinfo=UTC)
        make_price(cluster=self.cluster, unit_price=Decimal("2.000000"), effective_from=since)
        make_price(
            deployment=self.deployment,
            unit=Unit.INPUT_TOKENS_1M,
            unit_price=Decimal("0.500000"),
            effective_from=since,
        )
        # Another provider's cluster bills the same days: never part of this invoice.
        self.other = make_cluster(price=None, slug="elsewhere")
        make_price(cluster=self.other, unit_price=Decimal("7.000000"), effective_from=since)


def _at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


def _bill(stack: Stack) -> list[UsageRecord]:
    """May 4: 3 accelerator-hours (6.00) + 1M input tokens (0.50); May 5: 1 hour (2.00). Other provider: 1 h."""
    items = [
        UsageInput(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal("1"),
            occurred_at=_at(MAY_4, hour),
            idempotency_key=f"c:{hour}",
            subject_type="training_run",
            subject_id="7",
            cluster=stack.cluster,
        )
        for hour in (1, 2, 23)
    ]
    items += [
        UsageInput(
            unit=Unit.INPUT_TOKENS_1M,
            quantity=Decimal("1"),
            occurred_at=_at(MAY_4, 12),
            idempotency_key="d:1",
            subject_type="inference",
            subject_id="1",
            deployment=stack.deployment,
        ),
        UsageInput(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal("1"),
            occurred_at=_at(MAY_4, 5),
            idempotency_key="o:1",
            subject_type="training_run",
            subject_id="8",
            cluster=stack.other,
        ),
    ]
    return usage_record_batch(items=items)


def _bill_may_5(stack: Stack) -> UsageRecord:
    return usage_record_batch(
        items=[
            UsageInput(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal("1"),
                occurred_at=_at(MAY_5, 0),  # midnight UTC belongs to May 5
                idempotency_key="c:may5",
                subject_type="training_run",
                subject_id="7",
                cluster=stack.cluster,
            )
        ]
    )[0]


@pytest.fixture
def stack() -> Stack:
    return Stack()


def _invoice(stack: Stack, text: str, tolerance: str = "0.01") -> InvoiceImport:
    return reconciliation_import(
        provider=stack.provider, filename="cur.csv", text=text, tolerance=Decimal(tolerance)
    )


MATCHING = CUR + (
    "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,2.0000000000,USD\n"
    "2026-05-04T02:00:00Z,AmazonEC2,gpu-east,1,2.0000000000,USD\n"
    "2026-05-04T23:00:00Z,AmazonEC2,gpu-east,1,2,USD\n"
    "2026-05-04T12:00:00Z,AmazonBedrock,chat,1,0.5,USD\n"
    "2026-05-05T00:00:00Z,AmazonEC2,gpu-east,1,2.00,USD\n"
)


def _cells(cells: list[ReconciliationCell]) -> dict[tuple[date, str], tuple[Decimal, Decimal, bool]]:
    return {(c.day, c.key): (c.invoice_amount, c.ledger_amount, c.mismatch) for c in cells}


def test_an_invoice_that_matches_the_ledger_shows_no_mismatch_from_rollups_or_the_unfolded_tail(
    stack: Stack,
) -> None:
    _bill(stack)
    rollups_update()  # May 4 comes from the rollups, May 5 from the ledger tail after the watermark
    _bill_may_5(stack)
    invoice = _invoice(stack, MATCHING)

    assert (invoice.period_start, invoice.period_end, invoice.row_count) == (MAY_4, MAY_5, 5)
    result = reconciliation_result(invoice=invoice)
    assert result.currency == "USD"
    assert _cells(result.by_resource) == {
        (MAY_4, "chat"): (Decimal("0.5"), Decimal("0.5"), False),
        (MAY_4, "gpu-east"): (Decimal("6"), Decimal("6"), False),
        (MAY_5, "gpu-east"): (Decimal("2"), Decimal("2"), False),
    }
    assert _cells(result.by_service) == {
        (MAY_4, "Accelerator compute"): (Decimal("6"), Decimal("6"), False),
        (MAY_4, "Model inference"): (Decimal("0.5"), Decimal("0.5"), False),
        (MAY_5, "Accelerator compute"): (Decimal("2"), Decimal("2"), False),
    }
    assert result.mismatches == [] and result.service_mismatches == []
    assert result.invoice_total == result.ledger_total == Decimal("8.5")
    assert {c.key: c.ledger_rows for c in result.by_resource if c.day == MAY_4} == {"gpu-east": 3, "chat": 1}
    rollups_update()
    assert _cells(reconciliation_result(invoice=invoice).by_resource) == _cells(result.by_resource)


def test_a_day_off_by_more_than_the_tolerance_is_flagged_with_the_exact_difference(stack: Stack) -> None:
    _bill(stack)
    _bill_may_5(stack)
    invoice = _invoice(
        stack,
        CUR2
        + "2026-05-04 01:00:00,AmazonEC2,gpu-east,3,6.005,USD\n"  # within 0.01: not flagged
        + "2026-05-04 12:00:00,AmazonBedrock,chat,1,0.5,USD\n"
        + "2026-05-05 00:00:00,AmazonEC2,gpu-east,1,2.015000001,USD\n",  # 0.015000001: flagged
    )
    result = reconciliation_result(invoice=invoice)
    assert [(c.day, c.key, c.difference) for c in result.mismatches] == [
        (MAY_5, "gpu-east", Decimal("0.015000001"))
    ]
    assert isinstance(result.mismatches[0].difference, Decimal)
    may_4 = next(c for c in result.by_resource if (c.day, c.key) == (MAY_4, "gpu-east"))
    assert (may_4.difference, may_4.mismatch) == (Decimal("0.005"), False)
    assert [(c.day, c.key) for c in result.service_mismatches] == [(MAY_5, "Accelerator compute")]
    # A looser tolerance flags nothing; a difference exactly at the tolerance is not beyond it.
    assert reconciliation_result(invoice=invoice, tolerance=Decimal("0.015000001")).mismatches == []


def test_usage_missing_from_the_invoice_and_lines_missing_from_the_ledger_are_flagged(stack: Stack) -> None:
    _bill(stack)
    invoice = _invoice(
        stack,
        CUR
        + "2026-05-04T01:00:00Z,AmazonEC2,i-0abc,1,4.5,USD\n"
        + "2026-05-04T01:00:00Z,AmazonS3,,1,0.25,USD\n",
    )
    assert _cells(reconciliation_result(invoice=invoice).by_resource) == {
        (MAY_4, ""): (Decimal("0.25"), Decimal("0"), True),
        (MAY_4, "chat"): (Decimal("0"), Decimal("0.5"), True),
        (MAY_4, "gpu-east"): (Decimal("0"), Decimal("6"), True),
        (MAY_4, "i-0abc"): (Decimal("4.5"), Decimal("0"), True),
    }


def test_other_currencies_of_the_provider_are_reported_not_compared(stack: Stack) -> None:
    eur = make_cluster(price=None, slug="gpu-eu", provider=stack.provider)
    make_price(cluster=eur, unit_price=Decimal("1.5"), effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    make_price(cluster=eur, unit_price=Decimal("1.5"), effective_from=datetime(2026, 1, 2, tzinfo=UTC))
    eur.prices.update(currency="EUR")
    usage_record_batch(
        items=[
            UsageInput(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal("2"),
                occurred_at=_at(MAY_4, 3),
                idempotency_key="eur",
                subject_type="training_run",
                subject_id="9",
                cluster=eur,
            )
        ]
    )
    result = reconciliation_result(
        invoice=_invoice(stack, CUR + "2026-05-04T01:00:00Z,AmazonEC2,gpu-eu,2,3,USD\n")
    )
    assert result.other_currencies == {"EUR": Decimal("3")}
    assert _cells(result.by_resource) == {(MAY_4, "gpu-eu"): (Decimal("3"), Decimal("0"), True)}


def test_drill_down_returns_the_invoice_lines_and_ledger_rows_behind_a_cell(stack: Stack) -> None:
    rows = _bill(stack)
    _bill_may_5(stack)
    invoice = _invoice(stack, MATCHING)

    cell = reconciliation_cell_rows(invoice=invoice, day=MAY_4, resource_id="gpu-east")
    assert [line.line_number for line in cell.invoice_lines] == [2, 3, 4]
    assert [r.pk for r in cell.ledger_rows] == [r.pk for r in rows[:3]]
    assert cell.ledger_row_count == 3
    for row in cell.ledger_rows:  # the inverse query agrees with billing.focus
        assert (
            focus_resource(unit=row.unit, cluster_slug="gpu-east", deployment_slug=None).resource_id
            == "gpu-east"
        )

    by_service = reconciliation_cell_rows(invoice=invoice, day=MAY_4, service="Model inference")
    assert [line.line_number for line in by_service.invoice_lines] == [5]
    assert [r.pk for r in by_service.ledger_rows] == [rows[3].pk]
    limited = reconciliation_cell_rows(invoice=invoice, day=MAY_4, resource_id="gpu-east", limit=2)
    assert (len(limited.ledger_rows), limited.ledger_row_count) == (2, 3)


def test_a_bad_invoice_csv_reports_line_and_column_errors_and_imports_nothing(stack: Stack) -> None:
    text = CUR + (
        "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,2,USD\n"  # 2: fine
        "last tuesday,AmazonEC2,gpu-east,1,2,USD\n"  # 3
        "2026-05-04T01:00:00Z,,gpu-east,x,abc,USD\n"  # 4
        "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,NaN,\n"  # 5
        "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,-Infinity,US$\n"  # 6
        "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,2,EUR\n"  # 7
    )
    with pytest.raises(FileImportError) as caught:
        _invoice(stack, text)
    assert [str(e) for e in caught.value.errors] == [
        "line 3, column lineItem/UsageStartDate: not an ISO 8601 time: 'last tuesday'",
        "line 4, column lineItem/ProductCode: required",
        "line 4, column lineItem/UnblendedCost: not a decimal: 'abc'",
        "line 4, column lineItem/UsageAmount: not a decimal: 'x'",
        "line 5, column lineItem/CurrencyCode: required",
        "line 5, column lineItem/UnblendedCost: not a finite decimal: 'NaN'",
        "line 6, column lineItem/UnblendedCost: not a finite decimal: '-Infinity'",
        "line 6, column lineItem/CurrencyCode: must be three letters: 'US$'",
        "line 7, column lineItem/CurrencyCode: EUR differs from USD (line 2); import one currency per file",
    ]
    with pytest.raises(FileImportError) as caught:
        _invoice(stack, "lineItem/UsageStartDate,lineItem/UnblendedCost,line_item_unblended_cost\n")
    assert [str(e) for e in caught.value.errors] == [
        "line 1, column lineItem/ProductCode: missing column (or line_item_product_code or ServiceName)",
        "line 1, column line_item_unblended_cost: same field as column lineItem/UnblendedCost; keep one",
        "line 1, column lineItem/CurrencyCode: missing column (or line_item_currency_code or BillingCurrency)",
    ]
    with pytest.raises(FileImportError) as caught:
        _invoice(stack, CUR)
    assert [str(e) for e in caught.value.errors] == ["line 1, column : no invoice lines after the header"]
    assert InvoiceImport.objects.count() == 0 and InvoiceLine.objects.count() == 0


def test_the_cli_prints_the_differences_and_exits_non_zero_on_a_bad_file(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _bill(stack)
    path = tmp_path / "cur.csv"
    path.write_text(
        MATCHING.replace(
            "2026-05-04T23:00:00Z,AmazonEC2,gpu-east,1,2,USD",
            "2026-05-04T23:00:00Z,AmazonEC2,gpu-east,1,2.5,USD",
        )
    )
    out = io.StringIO()
    call_command("reconcile", "import", "--provider", "aws-main", str(path), "--tolerance", "0.1", stdout=out)
    text = out.getvalue()
    assert "2 (day, resource) difference(s) beyond the tolerance" in text
    assert "2026-05-04 gpu-east: invoice 6.5" in text and "difference 0.5" in text
    assert "2026-05-05 gpu-east: invoice 2" in text  # never billed in the ledger: flagged too

    path.write_text(CUR + "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,abc,USD\n")
    err = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("reconcile", "import", "--provider", "aws-main", str(path), stderr=err)
    assert failed.value.returncode == 1
    assert err.getvalue().strip() == "line 2, column lineItem/UnblendedCost: not a decimal: 'abc'"
    assert InvoiceImport.objects.count() == 1


def test_the_api_creates_lists_retrieves_and_drills_down(stack: Stack, auditor: User) -> None:
    rows = _bill(stack)
    client = api_client(auditor)  # auditors reconcile too
    upload = SimpleUploadedFile("cur.csv", MATCHING.replace(",2.00,USD", ",2.50,USD").encode())
    response = client.post(
        "/api/invoice-imports/",
        {"provider": "aws-main", "tolerance": "0.01", "file": upload},
        format="multipart",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["provider"], body["row_count"], body["mismatch_count"]) == ("aws-main", 5, 1)
    assert body["by_resource"][-1] == {
        "day": "2026-05-05",
        "resource_id": "gpu-east",
        "services": ["Accelerator compute"],
        "invoice_amount": "2.500000000",
        "ledger_amount": "0.000000000",
        "difference": "2.500000000",
        "mismatch": True,
        "invoice_lines": 1,
        "ledger_rows": 0,
    }
    listed = client.get("/api/invoice-imports/").json()
    assert [i["id"] for i in listed["results"]] == [body["id"]]
    assert client.get(f"/api/invoice-imports/{body['id']}/").json()["by_service"] == body["by_service"]
    cell = client.get(
        f"/api/invoice-imports/{body['id']}/rows/", {"day": "2026-05-04", "resource": "gpu-east"}
    ).json()
    assert [r["id"] for r in cell["ledger_rows"]] == [r.pk for r in rows[:3]]
    assert cell["ledger_rows"][0]["url"].endswith(f"/api/usage-records/{rows[0].pk}/")
    assert [line["line_number"] for line in cell["invoice_lines"]] == [2, 3, 4]
    assert client.get(f"/api/invoice-imports/{body['id']}/rows/", {"day": "soon"}).status_code == 400


def test_the_api_answers_400_with_the_errors_and_403_to_viewers(stack: Stack, operator: User) -> None:
    bad = SimpleUploadedFile(
        "cur.csv", (CUR + "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,abc,USD\n").encode()
    )
    response = api_client(operator).post(
        "/api/invoice-imports/", {"provider": "aws-main", "file": bad}, format="multipart"
    )
    assert response.status_code == 400
    assert response.json() == {
        "errors": [{"line": 2, "column": "lineItem/UnblendedCost", "message": "not a decimal: 'abc'"}]
    }
    viewer = api_client(make_user(Role.VIEWER))
    assert viewer.get("/api/invoice-imports/").status_code == 403
    upload = SimpleUploadedFile("cur.csv", MATCHING.encode())
    assert (
        viewer.post(
            "/api/invoice-imports/", {"provider": "aws-main", "file": upload}, format="multipart"
        ).status_code
        == 403
    )
    assert InvoiceImport.objects.count() == 0


def test_the_pages_upload_show_mismatches_and_drill_down_to_ledger_rows(stack: Stack, operator: User) -> None:
    rows = _bill(stack)
    client = Client()
    client.force_login(operator)
    bad = SimpleUploadedFile(
        "cur.csv", (CUR + "2026-05-04T01:00:00Z,AmazonEC2,gpu-east,1,abc,USD\n").encode()
    )
    response = client.post(
        "/billing/reconciliation/", {"provider": "aws-main", "tolerance": "0.01", "file": bad}
    )
    assert response.status_code == 400
    assert "line 2, column lineItem/UnblendedCost: not a decimal" in response.content.decode()

    upload = SimpleUploadedFile("cur.csv", MATCHING.encode())
    response = client.post(
        "/billing/reconciliation/", {"provider": "aws-main", "tolerance": "0.01", "file": upload}
    )
    assert response.status_code == 302
    invoice = InvoiceImport.objects.get()
    assert response["Location"] == f"/billing/reconciliation/{invoice.pk}/"
    assert "cur.csv" in client.get("/billing/reconciliation/").content.decode()
    page = client.get(response["Location"]).content.decode()
    assert 'id="mismatch-count">1<' in page  # May 5 was never billed
    assert page.count('<tr class="mismatch') == 2  # its resource row and its service row
    page = client.get(response["Location"], {"day": "2026-05-04", "resource": "gpu-east"}).content.decode()
    for row in rows[:3]:
        assert f'href="/api/usage-records/{row.pk}/"' in page
    assert f'href="/api/usage-records/{rows[3].pk}/"' not in page

    client.force_login(make_user(Role.VIEWER))
    assert client.get(f"/billing/reconciliation/{invoice.pk}/").status_code == 403
