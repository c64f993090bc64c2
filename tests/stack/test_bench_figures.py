"""The docs' benchmark tables are their committed JSON, rendered (bench.figures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.figures import FIGURES, Figure, diloco_table, figures_stale, figures_write
from bench.meta import run_meta


def test_every_table_in_the_docs_is_what_its_json_renders() -> None:
    assert figures_stale() == [], "run: python manage.py bench figures"


def test_a_changed_figure_makes_the_table_stale_until_it_is_rendered_again(tmp_path: Path) -> None:
    source = tmp_path / "bench.json"
    doc = json.loads(FIGURES[0].source.read_text())
    doc["summary"]["loss_ratio_4bit_vs_fp32"] = 1.25
    doc["targets"]["loss_ratio_4bit_vs_fp32"] = {"value": 1.25, "target": "<= 1.01", "met": False}
    doc["meta"] = {
        "commit": "abc123",
        "date": "2026-12-05T08:00:00+00:00",
        "cpus": 2,
        "load_average": [3.5, 2.0, 1.0],
    }
    source.write_text(json.dumps(doc))
    page = tmp_path / "page.md"
    shutil.copy(FIGURES[0].doc, page)
    figure = Figure(FIGURES[0].name, page, source, diloco_table)

    assert figures_stale((figure,)) == [figure.name]
    assert figures_write((figure,)) == [figure.name]
    assert figures_stale((figure,)) == []
    text = page.read_text()
    assert "| `loss_ratio_4bit_vs_fp32` | 1.2500 | <= 1.01 | **missed** | measured |" in text
    assert "commit `abc123`, 2026-12-05T08:00:00+00:00, 2 CPUs, load average 3.5/2.0/1.0" in text
    # The simulator's figures say so.
    assert "| `goodput_with_failure` | 0.9084 | >= 0.85 | met | simulated |" in text


def test_a_benchmark_run_records_its_commit_date_and_load() -> None:
    meta = run_meta()
    assert len(meta["commit"].removesuffix("+dirty")) == 12
    assert meta["date"].endswith("+00:00") and meta["cpus"] >= 1 and len(meta["load_average"]) == 3
