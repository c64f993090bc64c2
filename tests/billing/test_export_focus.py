"""FOCUS 1.2 conformance: an export job's files, written to S3 (moto on loopback), pass the FinOps
focus-validator (pinned in requirements-focus.txt, run from its own venv, see the Makefile)."""

from __future__ import annotations

import csv
import json
import subprocess
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from billing.exports import ExportFilters, export_job_create, export_job_run, export_stream
from billing.models import Unit, UsageRecord
from billing.services import UsageInput, usage_record_batch, usage_reverse
from tests.factories import make_cluster, make_deployment, make_price, make_provider, make_workflow, unique

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 5, 4, 9, tzinfo=UTC)
VALIDATOR_VENV = Path(settings.BASE_DIR) / ".venv-focus"
# What Switchyard's ledger supports, in the validator's applicability criteria: the rules for
# these are checked, the rest (commitment discounts, capacity reservations, ...) do not apply.
APPLICABILITY = (
    "USAGE_MEASUREMENT_SUPPORTED",
    "UNIT_PRICING_SUPPORTED",
    "PUBLIC_PRICE_LIST_SUPPORTED",
    "BILLING_BASED_ON_PROVISIONED_RESOURCES_SUPPORTED",
    "RESOURCE_TYPE_ASSIGNMENT_SUPPORTED",
    "REGION_SUPPORTED",
    "TAGGING_SUPPORTED",
)

# Rules focus-validator 2.2.1 reports against any FOCUS 1.2 file like ours, for reasons in the
# validator, not the file (each seen in its --explain-mode output):
# - it applies a rule when ANY of the rule's applicability criteria is claimed (the spec: all),
#   so the PricingCurrency* columns, which need virtual currencies or prices in another currency
#   than the bill (neither happens here), are asked for because PUBLIC_PRICE_LIST_SUPPORTED is;
# - its ConsumedQuantity nullability SQL reads CommitmentDiscountStatus, a column FOCUS asks for
#   only where commitment discounts exist, and fails on the missing column;
# - it models "InvoiceId MUST NOT be null when the charge is on an invoice" as "never null"; a
#   ledger row is on no invoice yet (reconciliation matches invoices to it later).
VALIDATOR_GAPS = frozenset(
    {f"CostAndUsage-D-{n:03d}-C" for n in (46, 47, 48, 50, 51, 52, 54, 55, 56)}
    | {f"PricingCurrencyContractedUnitPrice-C-{n:03d}-M" for n in (1, 2)}
    | {f"PricingCurrencyEffectiveCost-C-{n:03d}-M" for n in (1, 2, 3, 4)}
    | {"PricingCurrencyListUnitPrice-C-001-M", "PricingCurrencyListUnitPrice-C-002-M",
       "PricingCurrencyListUnitPrice-C-003-M", "PricingCurrencyListUnitPrice-C-004-C",
       "PricingCurrencyListUnitPrice-C-005-C", "PricingCurrencyListUnitPrice-C-007-C",
       "PricingCurrencyListUnitPrice-C-008-M"}
    | {f"ConsumedQuantity-C-{n:03d}-C" for n in (0, 3, 4, 5, 6)}
    | {"InvoiceId-C-005-C"}
)  # fmt: skip


@pytest.fixture
def billed(operator: User) -> dict[str, Any]:
    """Accelerator-hours on a cluster, the four token kinds and requests on a deployment of a
    team's workflow, and a reversal of each kind of charge."""
    cluster = make_cluster(slug=unique("gpu"), price=None, region="europe-west4",
                           provider=make_provider(display_name="Lab", region="europe-west4"))  # fmt: skip
    make_price(cluster=cluster, unit_price=Decimal("2.5"), effective_from=DAY - timedelta(days=1))
    deployment = make_deployment(slug=unique("chat"))
    token_units = [Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M, Unit.CACHED_INPUT_TOKENS_1M,
                   Unit.REASONING_TOKENS_1M, Unit.REQUEST]  # fmt: skip
    for unit in token_units:
        make_price(
            deployment=deployment,
            unit=unit,
            unit_price=Decimal("0.6"),
            effective_from=DAY - timedelta(days=1),
        )
    workflow = make_workflow(owner=operator, deployments=[deployment], slug=unique("wf"), team="search")
    usage_record_batch(
        items=[
            UsageInput(unit=Unit.ACCELERATOR_HOUR, quantity=Decimal("0.123456789"),
                       occurred_at=DAY + timedelta(hours=i, microseconds=250), idempotency_key=unique("gpu"),
                       subject_type="training_run", subject_id="r1", cluster=cluster, team="research")
            for i in range(6)
        ]
        + [
            UsageInput(unit=unit, quantity=Decimal("0.000123457") if unit != Unit.REQUEST else Decimal(1),
                       occurred_at=DAY + timedelta(minutes=i), idempotency_key=unique("req"),
                       subject_type="inference_request", subject_id=str(i), deployment=deployment,
                       workflow=workflow, team="search")
            for i, unit in enumerate(token_units)
        ]
    )  # fmt: skip
    first_gpu = UsageRecord.objects.filter(unit=Unit.ACCELERATOR_HOUR).order_by("sequence").first()
    first_tokens = UsageRecord.objects.filter(unit=Unit.OUTPUT_TOKENS_1M).first()
    assert first_gpu is not None and first_tokens is not None
    usage_reverse(record=first_gpu, reason="double billed", occurred_at=DAY + timedelta(hours=7))
    usage_reverse(record=first_tokens, reason="refunded", occurred_at=DAY + timedelta(hours=8))
    return {"cluster": cluster, "deployment": deployment}


def _focus_validate(data_file: Path, tmp_path: Path) -> tuple[dict[str, str], int]:
    """Run focus-validator on a file: ({rule id: message} of rules that failed or errored, how many passed)."""
    python = VALIDATOR_VENV / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{VALIDATOR_VENV} is missing: run 'make focus-validator' (make test does)")
    # The validator reads its currency list from a path relative to its package's parent folder.
    site = subprocess.run(  # noqa: S603 (our own venv's python, fixed arguments)
        [str(python), "-c", "import focus_validator, pathlib; print(pathlib.Path(focus_validator.__file__).parents[1])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    report = tmp_path / f"{data_file.name}.xml"
    result = subprocess.run(  # noqa: S603
        [str(VALIDATOR_VENV / "bin" / "focus-validator"), "--data-file", str(data_file),
         "--validate-version", "1.2", "--block-download", "--applicability-criteria", ",".join(APPLICABILITY),
         "--output-type", "unittest", "--output-destination", str(report)],
        cwd=site, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0 and report.exists(), result.stdout[-3000:] + result.stderr[-3000:]
    problems: dict[str, str] = {}
    passed = 0
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 (the validator's own report)
        rule = str(case.get("name")).split(" ")[0]
        outcomes = [*case.findall("failure"), *case.findall("error")]
        for outcome in outcomes:
            problems[rule] = str(outcome.get("message"))
        passed += not outcomes and not case.findall("skipped")
    return problems, passed


def test_an_export_with_reversal_rows_passes_the_focus_1_2_validator(
    billed: dict[str, Any], s3_store: Any, auditor: User, tmp_path: Path
) -> None:
    job = export_job_create(created_by=auditor, filters=ExportFilters(), formats=["csv", "jsonl", "parquet"])
    export_job_run(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    for name in ("usage.csv", "usage.parquet", "usage.jsonl"):
        body = s3_store.get_object(Bucket=s3_store.bucket, Key=f"switchyard/exports/{job.pk}/{name}")["Body"]
        (tmp_path / name).write_bytes(body.read())

    rows = list(csv.DictReader((tmp_path / "usage.csv").open(encoding="utf-8")))
    assert len(rows) == 13
    corrections = [r for r in rows if r["ChargeClass"] == "Correction"]
    assert len(corrections) == 2 and all(Decimal(r["BilledCost"]) < 0 for r in corrections)
    assert all(r["ChargeClass"] == "" for r in rows if not r["x_Reverses"])
    assert {r["x_Reverses"] for r in corrections} == {
        str(r.reverses_id) for r in UsageRecord.objects.filter(reverses__isnull=False)
    }

    # And the CSV streamed over /api/usage-export/ (written by PostgreSQL's COPY here).
    (tmp_path / "streamed.csv").write_bytes(b"".join(export_stream(filters=ExportFilters(), fmt="csv")))
    for name in ("usage.csv", "usage.parquet", "streamed.csv"):
        problems, passed = _focus_validate(tmp_path / name, tmp_path)
        assert {rule: message for rule, message in problems.items() if rule not in VALIDATOR_GAPS} == {}, name
        assert passed > 150, (name, passed)  # the rules did run: every mandatory column's checks pass

    # AI token usage the way the FOCUS working group's examples describe it.
    output = next(r for r in rows if r["x_Unit"] == Unit.OUTPUT_TOKENS_1M and not r["x_Reverses"])
    assert (output["ServiceCategory"], output["ServiceSubcategory"]) == (
        "AI and Machine Learning",
        "Generative AI",
    )
    assert (output["ConsumedQuantity"], output["ConsumedUnit"]) == ("123.457000000", "Tokens")
    assert (output["PricingQuantity"], output["PricingUnit"]) == ("0.000123457", "1000000 Tokens")
    assert output["SkuMeter"] == "Output Tokens"
    assert output["SkuId"] == f"deployment/{billed['deployment'].slug}/output_tokens_1m"
    assert output["SkuPriceId"] == f"price-book/{output['x_PriceBookId']}"
    assert (output["ChargeCategory"], output["ChargeFrequency"]) == ("Usage", "Usage-Based")
    assert (output["BillingPeriodStart"], output["BillingPeriodEnd"]) == (
        "2026-05-01T00:00:00Z",
        "2026-06-01T00:00:00Z",
    )
    assert (output["BillingAccountId"], output["BillingAccountName"]) == ("switchyard", "Switchyard")
    gpu = next(r for r in rows if r["x_Unit"] == Unit.ACCELERATOR_HOUR and not r["x_Reverses"])
    assert (gpu["ServiceCategory"], gpu["ConsumedUnit"], gpu["RegionId"]) == (
        "Compute",
        "Hours",
        "europe-west4",
    )
    assert (gpu["ProviderName"], gpu["InvoiceIssuerName"], gpu["ResourceType"]) == ("Lab", "Lab", "cluster")
    assert json.loads(gpu["Tags"]) == {"subject": "training_run:r1", "team": "research", "training_run": "r1"}
    jsonl = [json.loads(line) for line in (tmp_path / "usage.jsonl").read_text().splitlines()]
    assert {r["x_UsageRecordId"]: r["ChargeClass"] for r in jsonl} == {
        int(r["x_UsageRecordId"]): (r["ChargeClass"] or None) for r in rows
    }
