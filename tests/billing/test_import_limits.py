"""Billing's inputs at their limits: files (price CSV and catalog, invoices), the API, the pages and
the commands answer a 4xx or one readable line naming the field, line and column, and write nothing."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from billing.exports.columns import COLUMNS
from billing.models import Budget, ExportJob, InvoiceImport, PriceBook
from billing.price_import import FileImportError, price_import_file
from billing.reconciliation import reconciliation_import
from registry.models import Cluster, Provider
from tests.factories import api_client, make_cluster, make_provider
from training.models import TrainingRun

pytestmark = pytest.mark.django_db

HEADER = "target_type,target,unit,unit_price,currency,effective_from,effective_to,note\n"
INVOICE = "lineItem/UsageStartDate,lineItem/ProductCode,lineItem/ResourceId,lineItem/UnblendedCost,lineItem/CurrencyCode\n"  # noqa: E501
BIG = 200 * 1024  # past the csv module's 128 KiB field limit
DEEP = 100_000


@pytest.fixture
def cluster() -> Cluster:
    return make_cluster(price=None, slug="gpu-east")


@pytest.fixture
def provider() -> Provider:
    return make_provider(slug="aws-main")


def _price_errors(text: str, file_format: str = "csv") -> list[str]:
    with pytest.raises(FileImportError) as caught:
        price_import_file(text=text, file_format=file_format)
    return [str(e) for e in caught.value.errors]


def _invoice_errors(provider: Provider, text: str) -> list[str]:
    with pytest.raises(FileImportError) as caught:
        reconciliation_import(provider=provider, filename="i.csv", text=text)
    return [str(e) for e in caught.value.errors]


def _page(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- Price files ----------------------------------------------------------------------------------------


def test_a_price_csv_field_over_128_kib_is_an_error_naming_its_line_and_column(cluster: Cluster) -> None:
    text = HEADER + f'cluster,gpu-east,accelerator_hour,2,USD,2026-02-01T00:00:00Z,,"{"n" * BIG}"\n'
    assert _price_errors(text) == ["line 2, column note: longer than 131072 characters"]
    assert not PriceBook.objects.exists()


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (
            "0001-01-01T00:00:00+05:00",
            "outside the times that can be stored (0001-01-01 to 9999-12-30 in UTC)",
        ),
        (
            "9999-12-31T23:59:59-05:00",
            "outside the times that can be stored (0001-01-01 to 9999-12-30 in UTC)",
        ),
        ("٢٠٢٦-02-01T00:00:00Z", "not an ISO 8601 time"),
    ],
)
def test_a_price_csv_time_that_does_not_exist_in_utc_is_an_error(
    cluster: Cluster, start: str, message: str
) -> None:
    text = HEADER + f"cluster,gpu-east,accelerator_hour,2,USD,{start},,\n"
    assert _price_errors(text) == [f"line 2, column effective_from: {message}: {start!r}"]


@pytest.mark.parametrize(
    ("price", "currency", "error"),
    [
        ("١٢", "USD", "column unit_price: write the number in ASCII digits 0-9: '١٢'"),
        ("1٫5", "USD", "column unit_price: not a decimal: '1٫5'"),
        ("2", "ABC", "column currency: not an ISO 4217 currency code: 'ABC'"),
        ("2", "€€€", "column currency: must be three letters: '€€€'"),
        ("1e20", "USD", "column unit_price: too large: '1e20'"),
    ],
)
def test_a_price_csv_number_or_currency_that_is_not_what_it_seems_is_refused(
    cluster: Cluster, price: str, currency: str, error: str
) -> None:
    text = HEADER + f"cluster,gpu-east,accelerator_hour,{price},{currency},2026-02-01T00:00:00Z,,\n"
    (only,) = _price_errors(text)
    assert only.startswith(f"line 2, {error}")
    assert not PriceBook.objects.exists()


def test_a_price_csv_cell_with_a_control_character_is_an_error(cluster: Cluster) -> None:
    text = HEADER + "cluster,gpu-east,accelerator_hour,2,USD,2026-02-01T00:00:00Z,,a\x00b\n"
    assert _price_errors(text) == ["line 2, column note: contains a control character (U+0000) at position 2"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[" * DEEP + "]" * DEEP, "line 1, column : nested more than 3 levels deep"),
        ('[{"target_type": "cluster", "note": [[[["x"]]]]}]', "entry 1, column note: nested more than 3"),
        ('[{"target_type": "cluster", "unit_price": NaN}]', "line 1, column : not valid JSON"),
    ],
)
def test_a_deeply_nested_or_non_finite_catalog_is_an_error_not_a_recursion_error(
    cluster: Cluster, text: str, error: str
) -> None:
    (first, *_) = _price_errors(text, "json")
    assert first.startswith(error)


def test_the_prices_command_prints_the_line_and_column_and_exits_non_zero(
    cluster: Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "prices.csv"
    path.write_text(HEADER + f'cluster,gpu-east,accelerator_hour,2,USD,2026-02-01T00:00:00Z,,"{"n" * BIG}"\n')
    with pytest.raises(CommandError, match="1 error"):
        call_command("prices", "import", str(path))
    catalog = tmp_path / "deep.json"
    catalog.write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("prices", "import", str(catalog))


def test_the_prices_page_shows_the_oversized_field_as_a_form_error(
    cluster: Cluster, admin_user: User
) -> None:
    upload = SimpleUploadedFile(
        "p.csv",
        (HEADER + f'cluster,gpu-east,accelerator_hour,2,USD,2026-02-01T00:00:00Z,,"{"n" * BIG}"\n').encode(),
    )
    response = _page(admin_user).post("/billing/prices/", {"file": upload})
    assert response.status_code == 400
    assert "line 2, column note: longer than 131072 characters" in response.content.decode()


# --- Price books through the API -------------------------------------------------------------------------


def test_a_price_book_without_effective_from_is_400_naming_it(cluster: Cluster, admin_user: User) -> None:
    body = {"cluster": cluster.slug, "unit": "accelerator_hour", "unit_price": "2", "currency": "USD"}
    response = api_client(admin_user).post("/api/price-books/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["effective_from"]
    assert not PriceBook.objects.exists()


def test_a_price_book_ending_before_it_starts_is_400_naming_effective_to(
    cluster: Cluster, admin_user: User
) -> None:
    body = {
        "cluster": cluster.slug,
        "unit": "accelerator_hour",
        "unit_price": "2",
        "currency": "USD",
        "effective_from": "2026-05-01T00:00:00Z",
        "effective_to": "2026-04-01T00:00:00Z",
    }
    response = api_client(admin_user).post("/api/price-books/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"effective_to": ["must be after effective_from"]}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("currency", "€€€", "three letters"),
        ("currency", "XYZ", "ISO 4217"),
        ("unit_price", "١٢", "ASCII digits"),
        ("effective_from", "0001-01-01T00:00:00+05:00", "out of range"),
        ("effective_from", "٢٠٢٦-05-01T00:00:00Z", "ASCII digits"),
    ],
)
def test_a_price_book_field_that_is_not_what_it_seems_is_400_naming_it(
    cluster: Cluster, admin_user: User, field: str, value: str, message: str
) -> None:
    body = {
        "cluster": cluster.slug,
        "unit": "accelerator_hour",
        "unit_price": "2",
        "currency": "USD",
        "effective_from": "2026-05-01T00:00:00Z",
        field: value,
    }
    response = api_client(admin_user).post("/api/price-books/", body, format="json")
    assert response.status_code == 400
    assert message in response.json()[field][0]
    assert not PriceBook.objects.exists()


def test_a_price_book_in_lower_case_currency_is_stored_as_the_iso_code(
    cluster: Cluster, admin_user: User
) -> None:
    body = {
        "cluster": cluster.slug,
        "unit": "accelerator_hour",
        "unit_price": "2",
        "currency": "eur",
        "effective_from": "2026-05-01T00:00:00Z",
    }
    response = api_client(admin_user).post("/api/price-books/", body, format="json")
    assert response.status_code == 201
    assert PriceBook.objects.get().currency == "EUR"


# --- Invoices ------------------------------------------------------------------------------------------------


def test_an_invoice_field_over_128_kib_is_an_error_naming_its_line_and_column(provider: Provider) -> None:
    text = INVOICE + f'2026-05-04T00:00:00Z,AmazonEC2,"{"r" * BIG}",1.00,USD\n'
    assert _invoice_errors(provider, text) == [
        "line 2, column lineItem/ResourceId: longer than 131072 characters"
    ]
    assert not InvoiceImport.objects.exists()


@pytest.mark.parametrize(
    "start", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "9999-12-31T01:00:00"]
)
def test_an_invoice_time_that_does_not_exist_in_utc_is_an_error(provider: Provider, start: str) -> None:
    text = INVOICE + f"{start},AmazonEC2,gpu-east,1.00,USD\n"
    (only,) = _invoice_errors(provider, text)
    assert only.startswith("line 2, column lineItem/UsageStartDate: outside the times that can be stored")


@pytest.mark.parametrize(
    ("cost", "currency", "error"),
    [
        ("١٢", "USD", "column lineItem/UnblendedCost: write the number in ASCII digits"),
        ("1", "ZZZ", "column lineItem/CurrencyCode: not an ISO 4217 currency code"),
    ],
)
def test_an_invoice_number_or_currency_that_is_not_what_it_seems_is_refused(
    provider: Provider, cost: str, currency: str, error: str
) -> None:
    text = INVOICE + f"2026-05-04T00:00:00Z,AmazonEC2,gpu-east,{cost},{currency}\n"
    (only,) = _invoice_errors(provider, text)
    assert only.startswith(f"line 2, {error}")


def test_a_reconciliation_cell_on_a_day_past_the_last_one_is_refused_not_a_server_error(
    provider: Provider, auditor: User
) -> None:
    invoice = reconciliation_import(
        provider=provider,
        filename="i.csv",
        text=INVOICE + "2026-05-04T00:00:00Z,AmazonEC2,gpu-east,1.00,USD\n",
    )
    api = api_client(auditor).get(
        f"/api/invoice-imports/{invoice.pk}/rows/", {"day": "9999-12-31", "service": "x"}
    )
    assert api.status_code == 400 and list(api.json()) == ["day"]
    page = _page(auditor).get(f"/billing/reconciliation/{invoice.pk}/", {"day": "9999-12-31", "service": "x"})
    assert page.status_code == 200


def test_the_reconciliation_form_refuses_a_tolerance_its_column_cannot_hold(
    provider: Provider, auditor: User
) -> None:
    upload = SimpleUploadedFile(
        "i.csv", (INVOICE + "2026-05-04T00:00:00Z,AmazonEC2,gpu-east,1.00,USD\n").encode()
    )
    response = _page(auditor).post(
        "/billing/reconciliation/", {"provider": provider.slug, "tolerance": "1e20", "file": upload}
    )
    assert response.status_code == 400
    assert "no more than 12 digits" in response.content.decode()
    assert not InvoiceImport.objects.exists()


@pytest.mark.parametrize("tolerance", ["1e20", "١", "-1", "nan"])
def test_the_reconcile_command_refuses_a_bad_tolerance_in_one_line(
    provider: Provider, tmp_path: Path, tolerance: str
) -> None:
    path = tmp_path / "invoice.csv"
    path.write_text(INVOICE + "2026-05-04T00:00:00Z,AmazonEC2,gpu-east,1.00,USD\n")
    with pytest.raises(CommandError, match="^tolerance: ") as caught:
        call_command("reconcile", "import", str(path), "--provider", provider.slug, "--tolerance", tolerance)
    assert "\n" not in str(caught.value)
    assert not InvoiceImport.objects.exists()


def test_the_reconcile_command_reports_an_oversized_field_by_line_and_column(
    provider: Provider, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "invoice.csv"
    path.write_text(INVOICE + f'2026-05-04T00:00:00Z,AmazonEC2,"{"r" * BIG}",1.00,USD\n')
    with pytest.raises(CommandError, match="nothing was imported"):
        call_command("reconcile", "import", str(path), "--provider", provider.slug)


# --- Budgets -------------------------------------------------------------------------------------------------


def _budget_body(**fields: str) -> dict[str, str]:
    return {"name": "b", "scope": "team", "team": "vision", "limit_amount": "10", "currency": "USD", **fields}


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"currency": "€€€"}, "currency", "three letters"),
        ({"currency": "QQQ"}, "currency", "ISO 4217"),
        ({"limit_amount": "١٠"}, "limit_amount", "ASCII digits"),
        ({"limit_amount": "1e30"}, "limit_amount", "digits"),
        (
            {"scope": "training_run", "team": "", "training_run_id": "999999"},
            "training_run_id",
            "no training run",
        ),
        ({"scope": "training_run", "team": "", "training_run_id": "²"}, "training_run_id", "whole number"),
        ({"period": "custom", "custom_start": "0001-01-01T00:00:00+05:00"}, "custom_start", "out of range"),
    ],
)
def test_a_budget_that_names_nothing_real_is_400_naming_the_field(
    operator: User, fields: dict[str, str], field: str, message: str
) -> None:
    response = api_client(operator).post("/api/budgets/", _budget_body(**fields), format="json")
    assert response.status_code == 400
    assert message in " ".join(response.json()[field])
    assert not Budget.objects.exists()


def test_a_budget_on_a_run_that_exists_is_saved(operator: User) -> None:
    run = TrainingRun.objects.create(name="r", config={})
    body = _budget_body(scope="training_run", team="", training_run_id=str(run.pk))
    response = api_client(operator).post("/api/budgets/", body, format="json")
    assert response.status_code == 201, response.json()


def test_the_budget_form_refuses_an_unknown_run_and_a_made_up_currency(operator: User) -> None:
    response = _page(operator).post(
        "/billing/budgets/new/",
        {
            "name": "b",
            "scope": "training_run",
            "training_run_id": "999999",
            "period": "monthly",
            "limit_amount": "10",
            "currency": "€€€",
            "thresholds_text": "50, 80",
        },
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "no training run #999999" in page
    assert "must be three letters" in page
    other_digits = _page(operator).post(
        "/billing/budgets/new/",
        {"name": "b", "scope": "team", "team": "v", "period": "monthly", "limit_amount": "10", "currency": "USD",
         "thresholds_text": "50, ٨٠"},
    )  # fmt: skip
    assert other_digits.status_code == 400
    assert "whole percentages" in other_digits.content.decode()
    assert not Budget.objects.exists()


# --- Exports -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "٢٠٢٦-05-01"])
def test_the_usage_export_refuses_a_start_that_does_not_exist_in_utc(auditor: User, start: str) -> None:
    response = api_client(auditor).get("/api/usage-export/", {"start": start})
    assert response.status_code == 400
    assert list(response.json()) == ["start"]


@pytest.mark.parametrize(
    "body",
    [
        {"filters": {}, "provider": "aws"},
        {"filters": {}, "start": "2026-05-01"},
        {"filter": {"provider": "aws"}},
    ],
)
def test_an_export_job_with_a_field_it_does_not_know_is_400_naming_it_and_exports_nothing(
    auditor: User, body: dict[str, object]
) -> None:
    response = api_client(auditor).post("/api/export-jobs/", body, format="json")
    assert response.status_code == 400
    unknown = next(k for k in body if k != "filters")
    assert "unknown field" in response.json()[unknown][0]
    assert not ExportJob.objects.exists()


def test_an_export_job_filter_given_as_form_fields_it_does_not_know_is_refused(auditor: User) -> None:
    response = api_client(auditor).post("/api/export-jobs/", {"filters[provider]": "aws"}, format="multipart")
    assert response.status_code == 400
    assert "filters[provider]" in response.json()
    assert not ExportJob.objects.exists()
    # DRF's own spelling of a dict's entries in a form is known: "filters.provider".
    make_provider(slug="aws")
    spelled = api_client(auditor).post(
        "/api/export-jobs/", {"filters.provider": "aws", "formats[0]": "csv"}, format="multipart"
    )
    assert spelled.status_code == 201, spelled.json()
    assert ExportJob.objects.get().filters["provider"] == "aws"


@pytest.mark.parametrize(
    "manifest", ["[]", '"x"', '{"files": []}', '{"files": {"usage.csv": 3}}', "[" * DEEP + "]" * DEEP]
)
def test_export_verify_of_a_file_that_is_no_manifest_exits_non_zero_in_one_line(
    tmp_path: Path, manifest: str
) -> None:
    path = tmp_path / "manifest.json"
    path.write_text(manifest)
    with pytest.raises(CommandError) as caught:
        call_command("export", "verify", "--manifest", str(path))
    assert "\n" not in str(caught.value)


def test_export_run_refuses_a_start_that_does_not_exist_in_utc(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="start"):
        call_command("export", "run", "--out", str(tmp_path / "out"), "--start", "0001-01-01T00:00:00+05:00")


def test_export_verify_reports_an_oversized_csv_field_as_a_mismatch(tmp_path: Path) -> None:
    (tmp_path / "usage.csv").write_text(",".join(COLUMNS) + "\n" + f'"{"x" * BIG}"\n')
    manifest = {"files": {"usage.csv": {"format": "csv", "sha256": "0", "size": 0}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CommandError, match="export does not match its manifest"):
        call_command("export", "verify", "--manifest", str(tmp_path / "manifest.json"))


# --- The ledger page -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["currency=%E2%82%AC%E2%82%AC%E2%82%AC", "before=%C2%B2", "since=%D9%A2"])
def test_the_ledger_page_refuses_filters_that_are_not_what_they_seem(auditor: User, query: str) -> None:
    response = _page(auditor).get(f"/billing/ledger/?{query}")
    assert response.status_code == 400


def test_amounts_stay_exact_decimals(cluster: Cluster) -> None:
    text = HEADER + "cluster,gpu-east,accelerator_hour,2.000000001,usd,2026-02-01T00:00:00Z,,\n"
    (price,) = price_import_file(text=text, file_format="csv").created
    assert price.unit_price == Decimal("2.000000001") and price.currency == "USD"
