"""`manage.py bench scale` runs a tiny drill end to end and its report adds up (no timings asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3

from bench.scale.model import fragments_of, synthetic_shapes

ROOT = Path(__file__).resolve().parents[2]


STEPS = 2  # outer steps per drill: enough for a sweep, a down-delta and a resume


def _bench(*args: str, out: Path) -> dict[str, Any]:
    options = ["--params", "2e6", "--steps", str(STEPS), *args, "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "manage.py", "bench", "scale", *options],
        cwd=ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert json.loads(done.stdout) == report  # the same document printed and written
    return report


def _check_run(report: dict[str, Any], kind: str) -> None:
    run, figures = report["runs"][kind], report["figures"][kind]
    learners = report["setup"]["learners"]
    fragments = report["scale"]["fragments"]
    assert len(run["learners"]) == learners
    for learner in run["learners"]:
        assert learner["syncs"] == STEPS
        assert learner["bytes_up_per_sync"] > learner["payload_bytes_up_per_sync"] > 0  # blob headers
        assert learner["bytes_down_per_sync"] > 0
        # Joining reads full versions (fp32 parameters and the learners' copy): more than a sync.
        assert learner["join_bytes_down"] > report["scale"]["fp32_bytes"] > learner["bytes_down_per_sync"]
        assert learner["peak_rss_bytes"] > 0
    syncer = run["syncer"]
    assert syncer["versions_published"] == STEPS * fragments
    assert len(syncer["outer_step_seconds_each"]) == STEPS
    assert syncer["bytes_down_per_step"] >= learners * min(x["bytes_up_per_sync"] for x in run["learners"])
    store = run["store_after_steps"]
    assert store["bytes"] == sum(store["bytes_by_kind"].values()) > 0
    assert store["versions_stored"] == report["setup"]["keep_versions"] * fragments  # the sweep ran
    assert 0 < store["version_bytes"] < store["bytes"] <= store["bound_bytes"]
    resume = run["resume"]
    assert resume["seconds"] > resume["resume_call_seconds"] >= 0
    assert resume["versions_resumed_at"] == [STEPS] * fragments
    assert resume["objects_read"] == fragments  # one version per fragment, whatever the history
    # The SIGKILLed syncer left a delta per learner and fragment; the new one merges each once.
    assert resume["deltas_pulled_after_resume"] == learners * fragments
    assert sorted(resume["published_after_resume"]) == [[f, STEPS + 1] for f in range(fragments)]
    puts = run["puts"]
    assert puts["put_count"] >= puts["objects_written"] > 0
    assert 0 < puts["largest_single_put_bytes"] <= puts["largest_object_bytes"]
    assert figures["put_count"] == puts["put_count"]


def _check_targets(report: dict[str, Any]) -> None:
    targets = report["targets"]
    for name in ("largest_single_put", "peak_rss", "store_bytes", "resume"):
        assert isinstance(targets[f"{name}_target_met"], bool)
    assert targets["store_bytes_target_met"] is True
    assert targets["largest_single_put_target_met"] is True
    assert report["uploader_process"].startswith("none:")
    assert report["caveats"] and report["machine"]["cpus"] >= 1


def test_the_scale_drill_on_the_file_store_reports_consistent_counters(tmp_path: Path) -> None:
    report = _bench("--store", f"file://{tmp_path / 'store'}", out=tmp_path / "scale.json")
    assert report["setup"]["compression"] == ["4bit", "int8"]  # the default: both, a drill each
    for kind in ("4bit", "int8"):
        _check_run(report, kind)
        assert report["runs"][kind]["puts"]["multipart_uploads"] == 0
    _check_targets(report)
    up = {kind: f["bytes_up_per_sync_per_learner"] for kind, f in report["figures"].items()}
    down = {kind: f["bytes_down_per_sync_per_learner"] for kind, f in report["figures"].items()}
    assert up["4bit"] < up["int8"] and down["4bit"] < down["int8"]
    # The drill clears its own objects when done.
    assert not [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


def test_the_scale_drill_on_s3_counts_multipart_parts_as_puts(tmp_path: Path, s3_server: str) -> None:
    # The session's moto server (tests/conftest.py) rather than the bench's own: one fewer
    # interpreter to start. Without --store the bench starts moto itself, the same way.
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="bench-scale-test")
    store = ["--store", "s3://bench-scale-test/drill", "--endpoint-url", s3_server]
    report = _bench(
        *store, "--part-bytes", str(5 << 20), "--compression", "int4", out=tmp_path / "scale.json"
    )
    assert report["setup"]["compression"] == ["4bit"]
    _check_run(report, "4bit")
    puts = report["runs"]["4bit"]["puts"]
    # A version blob is larger than a 5 MiB part: it goes up in parts, none above the part size.
    assert puts["multipart_uploads"] > 0
    assert puts["put_count"] == puts["put_object_requests"] + puts["upload_part_requests"]
    assert puts["largest_single_put_bytes"] == 5 << 20 < puts["largest_object_bytes"]
    _check_targets(report)
    assert (
        boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket="bench-scale-test")["KeyCount"] == 0
    )


def test_the_synthetic_model_is_split_like_a_run_and_sized_as_asked() -> None:
    shapes = synthetic_shapes(1e9)
    assert (shapes.d_model, shapes.layers) == (2176, 16)
    assert 0.9e9 < shapes.params < 1.1e9
    fragments = fragments_of(shapes, 4)
    assert sorted(n for f in fragments for n in f) == sorted(shapes.tensors)
    assert all(any(n.startswith("blocks.") for n in f) for f in fragments)
