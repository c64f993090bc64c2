"""The docs' benchmark tables, rendered from the committed benchmark JSON.

python manage.py bench figures            rewrite every table between its markers
python manage.py bench figures --check    exit 1 naming each table that differs from its JSON

A table lives in a doc between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`; what is
between them is generated (never edited by hand), so a figure in the docs is always the one its
JSON holds, with the run's commit, date and machine load beside it. tests/stack/test_bench_figures.py
fails when a doc and its JSON disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# How each DiLoCo summary figure comes about. "measured": real training runs (eval loss) or
# wall-clock seconds of real processes; "derived": computed from sizes (the payload bytes the
# engine produced over data-parallel bytes computed from the parameter count), not bytes counted
# crossing a store; "simulated": the simulator's virtual clock.
DILOCO_KINDS = {
    "protocol_b_loss_ratio_m2": "measured",
    "protocol_b_loss_ratio_m4": "measured",
    "protocol_a_loss_ratio_vs_dp1x": "measured",
    "protocol_a_loss_ratio_vs_dp_mx": "measured",
    "bytes_ratio_fp32": "derived",
    "bytes_ratio_int8": "derived",
    "bytes_ratio_4bit": "derived",
    "bytes_ratio_fp32_both_ways": "derived",
    "bytes_ratio_int8_both_ways": "derived",
    "bytes_ratio_4bit_both_ways": "derived",
    "loss_ratio_4bit_vs_fp32": "measured",
    "loss_ratio_fp4_vs_fp32": "measured",
    "streaming_peak_bytes_ratio": "derived",
    "decoupled_speedup_with_straggler": "simulated",
    "goodput_with_failure": "simulated",
    "learner_overhead_ratio": "measured",
}


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _run_line(doc: dict[str, Any], source: str) -> str:
    meta = doc.get("meta")
    seconds = doc.get("real_seconds")
    took = f", {seconds:.0f} s" if isinstance(seconds, int | float) else ""
    if not meta:
        return f"From `{source}` (profile `{doc.get('profile', '?')}`{took}; the run predates the JSON's `meta`: commit, date and load not recorded)."
    load = "/".join(str(x) for x in meta.get("load_average", []))
    return (
        f"From `{source}` (profile `{doc.get('profile', '?')}`, commit `{meta['commit']}`, "
        f"{meta['date']}, {meta['cpus']} CPUs, load average {load} at the start{took})."
    )


def diloco_table(doc: dict[str, Any], source: str) -> list[str]:
    """Every summary figure with its target, whether it met it, and how it was obtained."""
    targets = doc.get("targets", {})
    lines = [
        _run_line(doc, source),
        "",
        "| summary key | value | target | met | how obtained |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, value in doc["summary"].items():
        target = targets.get(key, {})
        met = "" if not target else ("met" if target.get("met") else "**missed**")
        lines.append(
            f"| `{key}` | {_number(value)} | {target.get('target', '(reported)')} | {met} | "
            f"{DILOCO_KINDS.get(key, 'measured')} |"
        )
    return lines


@dataclass(frozen=True)
class Figure:
    name: str
    doc: Path
    source: Path
    render: Callable[[dict[str, Any], str], list[str]]


DILOCO_QUICK = ROOT / "bench" / "diloco" / "results" / "bench_quick.json"
FIGURES = (
    Figure("diloco-quick", ROOT / "docs" / "training-engine.md", DILOCO_QUICK, diloco_table),
    Figure("diloco-quick-training", ROOT / "docs" / "training.md", DILOCO_QUICK, diloco_table),
)


def _block(figure: Figure) -> str:
    source = (
        figure.source.relative_to(ROOT).as_posix()
        if figure.source.is_relative_to(ROOT)
        else str(figure.source)
    )
    body = figure.render(json.loads(figure.source.read_text()), source)
    return "\n".join([f"<!-- figures:{figure.name} -->", *body, f"<!-- /figures:{figure.name} -->"])


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- figures:{re.escape(name)} -->.*?<!-- /figures:{re.escape(name)} -->", re.S)


def figures_stale(figures: tuple[Figure, ...] = FIGURES) -> list[str]:
    """The names of the tables whose doc text differs from what their JSON renders (or whose
    markers are missing)."""
    stale = []
    for figure in figures:
        found = _pattern(figure.name).search(figure.doc.read_text())
        if found is None or found.group(0) != _block(figure):
            stale.append(figure.name)
    return stale


def figures_write(figures: tuple[Figure, ...] = FIGURES) -> list[str]:
    """Rewrite every stale table in place; returns the names rewritten."""
    written = []
    for name in figures_stale(figures):
        figure = next(f for f in figures if f.name == name)
        text = figure.doc.read_text()
        if _pattern(name).search(text) is None:
            raise SystemExit(f"{figure.doc}: no <!-- figures:{name} --> markers to fill")
        found = _pattern(name).search(text)
        assert found is not None  # noqa: S101 (checked above)
        figure.doc.write_text(text[: found.start()] + _block(figure) + text[found.end() :])
        written.append(name)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench figures", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which tables differ from their JSON")
    args = parser.parse_args(argv)
    if args.check:
        stale = figures_stale()
        for name in stale:
            print(f"stale: {name} (run: python manage.py bench figures)", file=sys.stderr)
        return 1 if stale else 0
    for name in figures_write():
        print(f"rewrote {name}")
    return 0
