"""`manage.py bench ledger`: the ledger at scale, on a scratch database.

    python manage.py bench ledger --rows 1000000 --json var/bench-ledger.json

Creates and migrates a scratch database next to the configured one (never
touching its data), then measures, printing JSON:
- ingest_rows_per_s: usage rows through billing.services.usage_record_batch,
  in bulk batches of 5,000 (priced, chained, idempotency-checked);
- ingest_small_rows_per_s: the realistic case, 8 concurrent writers each
  appending transactions of 1 to 10 rows with budgets to keep
  (bench.ledger.writers; --small-rows of them, --small-mode processes or threads);
- rollup_rows_per_s: billing.rollups.rollups_update folding them all;
- dashboard_query_p95_ms: the dashboard's spend-per-provider-per-day query
  over 30 days, repeated, with 10,000 rows appended after the last rollup, spread
  over several partitions (the unrolled tail it reads from the ledger);
- verify_rows_per_s: billing.selectors.ledger_verify walking every partition's chain;
- export_csv_rows_per_s and export_peak_rss_mb: streaming every row of every
  partition as CSV, merged by time (billing.exports, as the HTTP endpoint does),
  in a fresh process, so that its peak RSS is the export's own.
Targets (PostgreSQL, 2 cores; also printed under "targets"): ingest >= 20000,
small-transaction ingest >= 5000, export >= 200000, peak RSS < 200 MB,
dashboard p95 < 100 ms, verify >= 100000.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.db import connection

from bench.ledger.writers import writers_run, writers_seed
from billing import exports
from billing.models import LEDGER_PARTITION, Unit
from billing.rollups import ledger_partitions, rollups_update
from billing.selectors import ledger_verify, spend_per_provider_per_day
from billing.services import UsageInput, price_book_publish, usage_record_batch
from registry.models import Cluster, Provider

BATCH = 5000
TAIL_ROWS = 10_000
# Where the unrolled tail goes, written straight to each partition (whatever partitions
# the writer itself picks, the dashboard must add every partition's tail).
TAIL_PARTITIONS = (LEDGER_PARTITION, "bench-tail-1", "bench-tail-2", "bench-tail-3")


def _scratch_database() -> str:
    """Switch the default connection to a new, migrated database; return the old name."""
    old_name: str = connection.settings_dict["NAME"]
    connection.settings_dict.setdefault("TEST", {})
    if connection.vendor == "sqlite":
        connection.settings_dict["TEST"]["NAME"] = str(
            Path(old_name).with_name(f"bench-{os.getpid()}.sqlite3")
        )
    else:
        connection.settings_dict["TEST"]["NAME"] = f"switchyard_bench_{os.getpid()}"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    return old_name


def _seed() -> list[Cluster]:
    clusters = []
    for p in range(4):
        provider = Provider.objects.create(slug=f"bench-p{p}", display_name=f"Bench {p}", kind="aws")
        for c in range(5):
            cluster = Cluster.objects.create(
                provider=provider, slug=f"bench-p{p}-c{c}", accelerator_type="H100", accelerator_count=8
            )
            price_book_publish(
                unit=Unit.ACCELERATOR_HOUR,
                unit_price=Decimal("2.5") + Decimal(c) / 10,
                effective_from=datetime(2020, 1, 1, tzinfo=UTC),
                cluster=cluster,
            )
            clusters.append(cluster)
    return clusters


def _ingest(rows: int, clusters: list[Cluster], start: datetime) -> float:
    began = time.perf_counter()
    for offset in range(0, rows, BATCH):
        items = [
            UsageInput(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal(30 + i % 600) / Decimal(3600),
                # Spread over 60 days, in time order like live traffic.
                occurred_at=start + timedelta(seconds=(i * 5184000) // rows),
                idempotency_key=f"bench:{i}",
                subject_type="training_run",
                subject_id=str(i % 50),
                cluster=clusters[i % len(clusters)],
            )
            for i in range(offset, min(rows, offset + BATCH))
        ]
        usage_record_batch(items=items)
    return rows / (time.perf_counter() - began)


def _tail(clusters: list[Cluster], end: datetime) -> int:
    """TAIL_ROWS rows after the last rollup, over TAIL_PARTITIONS and the last 30 days."""
    for offset in range(0, TAIL_ROWS, 500):
        partition = TAIL_PARTITIONS[(offset // 500) % len(TAIL_PARTITIONS)]
        usage_record_batch(
            partition=partition,
            items=[
                UsageInput(
                    unit=Unit.ACCELERATOR_HOUR,
                    quantity=Decimal(60 + i % 600) / Decimal(3600),
                    occurred_at=end - timedelta(seconds=(i * 2_592_000) // TAIL_ROWS),
                    idempotency_key=f"bench-tail:{i}",
                    subject_type="training_run",
                    subject_id=str(i % 50),
                    cluster=clusters[i % len(clusters)],
                )
                for i in range(offset, min(TAIL_ROWS, offset + 500))
            ],
        )
    return TAIL_ROWS


def _verify_all() -> int:
    """Every partition's chain; the rows checked in all."""
    checked = 0
    for partition in ledger_partitions():
        verified = ledger_verify(partition=partition)
        if not verified.ok:
            raise RuntimeError(f"ledger verify failed on the benchmark data: {verified}")
        checked += verified.rows_checked
    return checked


def _dashboard_p95_ms(end: datetime, repeats: int = 40) -> float:
    timings = []
    for _ in range(repeats):
        began = time.perf_counter()
        spend_per_provider_per_day(since_day=(end - timedelta(days=30)).date())
        timings.append((time.perf_counter() - began) * 1000)
    return statistics.quantiles(timings, n=20)[-1]


def _export_in_child(json_out: Path) -> dict[str, Any]:
    """Stream the whole ledger as CSV in a fresh interpreter; report rows/s and peak RSS."""
    env = {**os.environ, "SWITCHYARD_BENCH_DB": connection.settings_dict["NAME"]}
    code = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'stack.settings'); "
        "from django.conf import settings; "
        "django.setup(); from django.db import connection; "
        "connection.settings_dict['NAME'] = os.environ['SWITCHYARD_BENCH_DB']; "
        "from bench.ledger.run import export_phase; export_phase(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", code, str(json_out)], check=True, env=env)  # noqa: S603
    return json.loads(json_out.read_text())  # type: ignore[no-any-return]


def export_phase(out_path: str) -> None:
    """Run in a child process by the benchmark: CSV-stream every row to nowhere."""
    began = time.perf_counter()
    lines = 0
    # Exactly what GET /api/usage-export/?format=csv streams, minus the socket.
    for chunk in exports.export_stream(filters=exports.export_filters_parse(params={}), fmt="csv"):
        lines += chunk.count(b"\n")
    rows = lines - 1  # the header line
    seconds = time.perf_counter() - began
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    Path(out_path).write_text(
        json.dumps(
            {"export_csv_rows_per_s": rows / seconds, "export_peak_rss_mb": peak_kb / 1024, "rows": rows}
        )
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="manage.py bench ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="bulk rows (batches of 5,000)")
    parser.add_argument("--small-rows", type=int, default=20_000, help="rows the 8 small writers append")
    parser.add_argument("--small-mode", choices=["processes", "threads"], default="processes")
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.rows < BATCH:
        parser.error(f"--rows must be at least {BATCH}")
    if args.small_rows < 100:
        parser.error("--small-rows must be at least 100")

    old_name = _scratch_database()
    try:
        clusters = _seed()
        start = datetime.now(UTC) - timedelta(days=60)
        result: dict[str, Any] = {"rows": args.rows, "database": connection.vendor, "batch": BATCH}
        result["ingest_rows_per_s"] = round(_ingest(args.rows, clusters, start), 1)

        small = writers_run(seed=writers_seed(clusters=clusters, start=start), rows=args.small_rows,
                            mode=args.small_mode)  # fmt: skip
        result["ingest_small_rows_per_s"] = small.pop("rows_per_s")
        result["ingest_small"] = small

        began = time.perf_counter()
        folded = rollups_update()
        result["rollup_rows_per_s"] = round(folded / (time.perf_counter() - began), 1)
        end = datetime.now(UTC)
        tail = _tail(clusters, end)
        result["dashboard_tail_rows"] = tail
        result["dashboard_query_p95_ms"] = round(_dashboard_p95_ms(end), 2)

        total = args.rows + small["rows"] + tail
        result["total_rows"] = total
        result["partitions"] = ledger_partitions()
        began = time.perf_counter()
        verified = _verify_all()
        if verified != total:
            raise RuntimeError(f"ledger verify checked {verified} of {total} rows")
        result["verify_rows_per_s"] = round(total / (time.perf_counter() - began), 1)

        export = _export_in_child(Path(f"/tmp/switchyard-bench-export-{os.getpid()}.json"))  # noqa: S108
        if export["rows"] != total:
            raise RuntimeError(f"the export streamed {export['rows']} of {total} rows")
        result["export_csv_rows_per_s"] = round(export["export_csv_rows_per_s"], 1)
        result["export_peak_rss_mb"] = round(export["export_peak_rss_mb"], 1)
        result["targets"] = {
            "ingest_rows_per_s": ">= 20000",
            "ingest_small_rows_per_s": ">= 5000",
            "export_csv_rows_per_s": ">= 200000",
            "export_peak_rss_mb": "< 200",
            "dashboard_query_p95_ms": "< 100",
            "verify_rows_per_s": ">= 100000",
        }
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0
