"""Price import from CSV and provider catalog files: all rows or none, errors by line and column."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from billing.models import PriceBook, Unit
from billing.price_import import FileImportError, price_import_file
from billing.selectors import ledger_verify
from billing.services import usage_record
from registry.auth.roles import Role
from registry.models import Cluster
from tests.factories import api_client, make_cluster, make_deployment, make_price, make_provider, make_user

pytestmark = pytest.mark.django_db

HEADER = "target_type,target,unit,unit_price,currency,effective_from,effective_to,note\n"
JAN_1 = datetime(2026, 1, 1, tzinfo=UTC)


def _csv(*rows: str) -> str:
    return HEADER + "".join(f"{row}\n" for row in rows)


def _errors(text: str, file_format: str = "csv") -> list[str]:
    with pytest.raises(FileImportError) as caught:
        price_import_file(text=text, file_format=file_format)
    return [str(e) for e in caught.value.errors]


@pytest.fixture
def cluster() -> Cluster:
    cluster = make_cluster(price=None, slug="gpu-east")
    make_price(cluster=cluster, unit_price=Decimal("2.000000"), effective_from=JAN_1)
    return cluster


def test_a_good_csv_imports_every_row_as_a_csv_version_numbered_after_the_existing_ones(
    cluster: Cluster,
) -> None:
    deployment = make_deployment(slug="chat-small")
    provider = make_provider(slug="acme")
    result = price_import_file(
        text=_csv(
            "cluster,gpu-east,accelerator_hour,2.50,USD,2026-02-01T00:00:00Z,,february",
            "cluster,gpu-east,accelerator_hour,2.750000001,usd,2026-03-01T02:00:00+02:00,2026-04-01T00:00:00Z,",
            "deployment,chat-small,input_tokens_1m,0.15,USD,2026-02-01T00:00:00Z,,",
            "provider,acme,egress_gb,0.09,EUR,2026-02-01T00:00:00Z,,",
        ),
        file_format="csv",
    )

    assert len(result.created) == 4 and result.unchanged == 0
    versions = list(PriceBook.objects.filter(cluster=cluster).order_by("version"))
    assert [(p.version, p.unit_price, p.source) for p in versions] == [
        (1, Decimal("2.000000000"), "manual"),
        (2, Decimal("2.500000000"), "csv"),
        (3, Decimal("2.750000001"), "csv"),
    ]
    assert versions[1].note == "february"
    assert versions[2].effective_from == datetime(2026, 3, 1, tzinfo=UTC)  # +02:00 read as UTC
    assert versions[2].effective_to == datetime(2026, 4, 1, tzinfo=UTC)
    assert versions[2].currency == "USD"
    dep_price = PriceBook.objects.get(deployment=deployment)
    assert (dep_price.version, dep_price.unit, dep_price.source) == (1, Unit.INPUT_TOKENS_1M, "csv")
    provider_price = PriceBook.objects.get(provider=provider, cluster=None, deployment=None)
    assert (provider_price.currency, provider_price.unit_price) == ("EUR", Decimal("0.090000000"))


def test_each_kind_of_bad_cell_is_reported_with_its_line_and_column_and_nothing_is_imported(
    cluster: Cluster,
) -> None:
    before = PriceBook.objects.count()
    errors = _errors(
        _csv(
            "cluster,gpu-east,accelerator_hour,3.00,USD,2026-02-01T00:00:00Z,,fine on its own",  # line 2
            "rack,gpu-east,accelerator_hour,3.00,USD,2026-02-01T00:00:00Z,,",  # 3
            "cluster,gpu-east,accelerator_hour,abc,USD,2026-02-01T00:00:00Z,,",  # 4
            "cluster,gpu-west,gpu_minute,-1,US,2026-02-01,,",  # 5
            "cluster,gpu-east,accelerator_hour,NaN,USD,yesterday,,",  # 6
            "cluster,gpu-east,accelerator_hour,Infinity,USD,2026-02-01T00:00:00Z,2026-01-01T00:00:00Z,",  # 7
            "cluster,gpu-east,accelerator_hour,0.0000000001,USD,2026-02-02T00:00:00Z,,",  # 8
            ",gpu-east,,,,,,",  # 9 (a row of only commas is skipped like a blank line)
            "deployment,gpu-east,request,1,USD,2026-02-01T00:00:00Z,,",  # 10: a cluster slug, not a deployment
            f"cluster,gpu-east,request,1,USD,2026-02-01T00:00:00Z,,{'x' * 201}",  # 11
            "cluster,gpu-east,accelerator_hour,3.00,USD,2026-02-01T00:00:00Z,,,surplus",  # 12
        )
    )

    assert errors == [
        "line 3, column target_type: must be one of cluster, deployment, provider: 'rack'",
        "line 4, column unit_price: not a decimal: 'abc'",
        "line 5, column target: no cluster with slug 'gpu-west'",
        "line 5, column unit: must be one of " + ", ".join(Unit.values) + ": 'gpu_minute'",
        "line 5, column unit_price: must not be negative: '-1'",
        "line 5, column currency: must be three letters: 'US'",
        "line 5, column effective_from: needs a UTC offset or Z: '2026-02-01'",
        "line 6, column unit_price: not a finite decimal: 'NaN'",
        "line 6, column effective_from: not an ISO 8601 time: 'yesterday'",
        "line 7, column unit_price: not a finite decimal: 'Infinity'",
        "line 7, column effective_to: must be after effective_from",
        "line 8, column unit_price: more than 9 decimal places: '0.0000000001'",
        "line 9, column target_type: required",
        "line 9, column unit: required",
        "line 9, column unit_price: required",
        "line 9, column currency: required",
        "line 9, column effective_from: required",
        "line 10, column target: no deployment with slug 'gpu-east'",
        "line 11, column note: longer than 200 characters",
        "line 12, column : more cells than the header has columns: 'surplus'",
    ]
    assert PriceBook.objects.count() == before


def test_two_rows_pricing_the_same_target_unit_and_time_are_an_error(cluster: Cluster) -> None:
    errors = _errors(
        _csv(
            "cluster,gpu-east,accelerator_hour,3.00,USD,2026-02-01T00:00:00Z,,",
            "cluster,gpu-east,accelerator_hour,3.10,USD,2026-02-01T01:00:00+01:00,,",
        )
    )
    assert errors == [
        "line 3, column effective_from: line 2 already prices this cluster and unit from this time"
    ]


def test_a_header_with_missing_unknown_or_doubled_columns_is_refused(cluster: Cluster) -> None:
    errors = _errors(
        "target_type,target,unit,unit_prise,currency,currency\ncluster,gpu-east,request,1,USD,USD\n"
    )
    assert errors == [
        "line 1, column unit_price: missing column",
        "line 1, column effective_from: missing column",
        "line 1, column unit_prise: unknown column (expected "
        "target_type, target, unit, unit_price, currency, effective_from, effective_to, note)",
        "line 1, column currency: column appears twice",
    ]
    assert _errors("") == ["line 1, column : the file is empty; expected a header row"]


def test_importing_the_same_file_twice_adds_nothing_the_second_time(cluster: Cluster) -> None:
    text = _csv("cluster,gpu-east,accelerator_hour,3.00,USD,2026-02-01T00:00:00Z,,")
    assert len(price_import_file(text=text, file_format="csv").created) == 1
    again = price_import_file(text=text, file_format="csv")
    assert (again.created, again.unchanged) == ([], 1)
    assert PriceBook.objects.filter(cluster=cluster).count() == 2


def test_a_provider_catalog_file_imports_with_source_catalog_and_errors_name_the_entry(
    cluster: Cluster,
) -> None:
    good = [
        {
            "target_type": "cluster",
            "target": "gpu-east",
            "unit": "accelerator_hour",
            "unit_price": "2.40",
            "currency": "USD",
            "effective_from": "2026-02-01T00:00:00Z",
            "effective_to": None,
        }
    ]
    result = price_import_file(text=json.dumps(good), file_format="json")
    assert [(p.version, p.source, p.unit_price) for p in result.created] == [(2, "catalog", Decimal("2.4"))]

    bad = [*good, {**good[0], "unit_price": "x", "colour": "red"}, "nope"]
    assert _errors(json.dumps(bad), "json") == [
        "entry 2, column colour: unknown field",
        "entry 2, column unit_price: not a decimal: 'x'",
        "entry 3, column : not an object",
    ]
    assert _errors("{not json", "json") == [
        "line 1, column : not valid JSON: Expecting property name enclosed in double quotes"
    ]
    assert PriceBook.objects.filter(cluster=cluster).count() == 2


def test_a_price_change_by_import_leaves_usage_billed_before_with_its_version_and_amount(
    cluster: Cluster,
) -> None:
    billed = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1.5"),
        occurred_at=datetime(2026, 1, 10, tzinfo=UTC),
        idempotency_key="before-import",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )
    price_import_file(
        text=_csv(
            # Backdated before the billed usage, and a later change: neither touches history.
            "cluster,gpu-east,accelerator_hour,9.00,USD,2026-01-05T00:00:00Z,,correction",
            "cluster,gpu-east,accelerator_hour,3.50,USD,2026-02-01T00:00:00Z,,",
        ),
        file_format="csv",
    )
    after = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1.5"),
        occurred_at=datetime(2026, 2, 2, tzinfo=UTC),
        idempotency_key="after-import",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )

    billed.refresh_from_db()
    assert (billed.price_book.version, billed.unit_price, billed.amount) == (
        1,
        Decimal("2.000000000"),
        Decimal("3.000000000"),
    )
    assert (after.price_book.version, after.amount) == (3, Decimal("5.250000000"))
    assert ledger_verify().ok


def test_the_cli_imports_a_file_and_prints_what_it_added(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    path.write_text(_csv("cluster,gpu-east,accelerator_hour,3.00,USD,2026-02-01T00:00:00Z,,"))
    out = io.StringIO()
    call_command("prices", "import", str(path), stdout=out)
    assert "imported 1 price version(s)" in out.getvalue()
    assert PriceBook.objects.filter(cluster=cluster, source="csv").count() == 1


def test_the_cli_exits_non_zero_with_one_line_per_error_and_at_most_twenty(
    cluster: Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "prices.csv"
    path.write_text(
        _csv(*[f"cluster,gpu-east,accelerator_hour,bad{i},USD,2026-02-01T00:00:00Z,," for i in range(25)])
    )
    err = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("prices", "import", str(path), stderr=err)
    assert failed.value.returncode == 1  # manage.py exits with it
    assert str(failed.value).endswith("25 error(s); nothing was imported")
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 21
    assert lines[0] == "line 2, column unit_price: not a decimal: 'bad0'"
    assert lines[19] == "line 21, column unit_price: not a decimal: 'bad19'"
    assert lines[20] == "... and 5 more"
    assert PriceBook.objects.filter(cluster=cluster).count() == 1


def test_the_api_imports_for_admins_and_answers_400_with_the_error_list(
    cluster: Cluster, admin_user: User
) -> None:
    client = api_client(admin_user)
    good = SimpleUploadedFile(
        "p.csv", _csv("cluster,gpu-east,accelerator_hour,3,USD,2026-02-01T00:00:00Z,,").encode()
    )
    response = client.post("/api/price-books/import/", {"file": good}, format="multipart")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["unchanged"] == 0
    assert [(p["cluster"], p["version"], p["source"]) for p in body["created"]] == [("gpu-east", 2, "csv")]

    bad = SimpleUploadedFile(
        "p.csv", _csv("cluster,gpu-east,accelerator_hour,abc,USD,2026-03-01T00:00:00Z,,").encode()
    )
    response = client.post("/api/price-books/import/", {"file": bad}, format="multipart")
    assert response.status_code == 400
    assert response.json() == {
        "errors": [{"line": 2, "column": "unit_price", "message": "not a decimal: 'abc'"}]
    }
    assert PriceBook.objects.filter(cluster=cluster).count() == 2


@pytest.mark.parametrize("role", [Role.OPERATOR, Role.AUDITOR, Role.VIEWER])
def test_only_admins_may_import_through_the_api(cluster: Cluster, role: Role) -> None:
    client = api_client(make_user(role))
    upload = SimpleUploadedFile(
        "p.csv", _csv("cluster,gpu-east,accelerator_hour,3,USD,2026-02-01T00:00:00Z,,").encode()
    )
    response = client.post("/api/price-books/import/", {"file": upload}, format="multipart")
    assert response.status_code == 403
    assert PriceBook.objects.filter(cluster=cluster).count() == 1


def test_a_version_that_priced_usage_cannot_be_edited_through_the_api_or_the_admin(cluster: Cluster) -> None:
    price = PriceBook.objects.get(cluster=cluster)
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1"),
        occurred_at=datetime(2026, 1, 2, tzinfo=UTC),
        idempotency_key="used",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )
    root = User.objects.create_superuser(username="root", password="pw-for-tests-1")
    response = api_client(root).patch(f"/api/price-books/{price.pk}/", {"unit_price": "1"}, format="json")
    assert response.status_code == 405
    client = Client()
    client.force_login(root)
    response = client.post(f"/admin/billing/pricebook/{price.pk}/change/", {"unit_price": "1"})
    assert response.status_code == 403
    price.refresh_from_db()
    assert price.unit_price == Decimal("2.000000000")


def test_the_prices_page_shows_versions_in_force_and_used_and_per_line_upload_errors(
    cluster: Cluster, admin_user: User
) -> None:
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1"),
        occurred_at=datetime(2026, 1, 2, tzinfo=UTC),
        idempotency_key="used",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )
    client = Client()
    client.force_login(admin_user)
    bad = SimpleUploadedFile(
        "p.csv", _csv("cluster,gpu-east,accelerator_hour,abc,USD,2026-02-01T00:00:00Z,,").encode()
    )
    response = client.post("/billing/prices/", {"file": bad})
    assert response.status_code == 400
    assert "line 2, column unit_price: not a decimal: &#x27;abc&#x27;" in response.content.decode()

    good = SimpleUploadedFile(
        "p.csv", _csv("cluster,gpu-east,accelerator_hour,3,USD,2099-01-01T00:00:00Z,,").encode()
    )
    response = client.post("/billing/prices/", {"file": good})
    assert response.status_code == 302
    page = client.get("/billing/prices/").content.decode()
    assert (
        page.count("badge badge-force") == 1 and page.count("badge badge-used") == 1
    )  # v1: in force and used; v2: future
    assert "CSV import" in page and "v2" in page


def test_viewers_do_not_see_the_prices_page_and_auditors_cannot_upload(cluster: Cluster) -> None:
    client = Client()
    client.force_login(make_user(Role.VIEWER))
    assert client.get("/billing/prices/").status_code == 403
    client.force_login(make_user(Role.AUDITOR))
    page = client.get("/billing/prices/")
    assert page.status_code == 200 and "Import prices" not in page.content.decode()
    upload = SimpleUploadedFile(
        "p.csv", _csv("cluster,gpu-east,accelerator_hour,3,USD,2026-02-01T00:00:00Z,,").encode()
    )
    assert client.post("/billing/prices/", {"file": upload}).status_code == 403
