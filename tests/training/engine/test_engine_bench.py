"""The bench CLI's contract (not its numbers): keys the Django command and the docs rely on."""

from __future__ import annotations

import json

from bench.diloco.run import main
from training.engine.simulator import time_to_loss

SUMMARY_KEYS = {
    "protocol_b_loss_ratio_m2",
    "protocol_b_loss_ratio_m4",
    "protocol_a_loss_ratio_vs_dp1x",
    "protocol_a_loss_ratio_vs_dp_mx",
    "bytes_ratio_fp32",
    "bytes_ratio_int8",
    "bytes_ratio_4bit",
    "bytes_ratio_fp32_both_ways",
    "bytes_ratio_int8_both_ways",
    "bytes_ratio_4bit_both_ways",
    "loss_ratio_4bit_vs_fp32",
    "loss_ratio_fp4_vs_fp32",
    "streaming_peak_bytes_ratio",
    "decoupled_speedup_with_straggler",
    "goodput_with_failure",
    "learner_overhead_ratio",
}
RUN_KEYS = {
    "method",
    "M",
    "H",
    "P",
    "outer_lr",
    "compression",
    "eval_loss",
    "bytes_sent_per_learner",
    "bytes_received_per_learner",
    "virtual_seconds",
    "real_seconds",
    "tokens",
}


def test_bench_diloco_writes_the_summary_and_runs_it_prints(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["diloco", "--smoke", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == written
    assert set(written["summary"]) == SUMMARY_KEYS
    sim_runs = [r for r in written["runs"] if r["method"] != "overhead"]
    assert {r["method"] for r in sim_runs} == {"data_parallel", "diloco", "streaming", "decoupled"}
    for run in sim_runs:
        assert RUN_KEYS <= set(run), run["name"]
    # Exact byte accounting: DiLoCo sends S per sync, data-parallel 2(M-1)/M * S per step.
    assert written["summary"]["bytes_ratio_fp32"] == written["config"]["H"]
    # Both ways: DiLoCo receives one down-delta per sync, as large as its Δ (fp32: S each way).
    assert written["summary"]["bytes_ratio_fp32_both_ways"] == written["config"]["H"]
    runs = {r["name"]: r for r in sim_runs}
    q4 = runs["diloco_m2_4bit"]
    assert q4["bytes_received_per_learner"] == q4["bytes_sent_per_learner"]
    # FP4 travels both ways in exactly as many bytes as int4 (two values a byte, a scale a row).
    fp4 = runs["diloco_m2_fp4"]
    assert fp4["compression"] == "fp4_e3m0"
    assert fp4["bytes_sent_per_learner"] == fp4["bytes_received_per_learner"] == q4["bytes_sent_per_learner"]
    assert (
        written["summary"]["loss_ratio_fp4_vs_fp32"] == fp4["eval_loss"] / runs["diloco_m2_fp32"]["eval_loss"]
    )
    assert written["targets"]["loss_ratio_fp4_vs_fp32"]["target"] == "<= 1.01"
    assert runs["dp_4b"]["batch_per_learner"] == 4 * runs["dp_b"]["batch_per_learner"]
    assert set(written["targets"]) <= SUMMARY_KEYS


def test_time_to_loss_is_the_first_evaluated_point_at_or_below_the_target():
    curve = [
        {"time": 1.0, "tokens_merged": 10.0},  # not evaluated: skipped
        {"time": 2.0, "tokens_merged": 20.0, "eval_loss": 3.0},
        {"time": 3.0, "tokens_merged": 30.0, "eval_loss": 2.5 + 1e-12},  # float noise counts as reached
        {"time": 4.0, "tokens_merged": 40.0, "eval_loss": 2.0},
    ]
    assert time_to_loss(curve, 2.5) == 3.0
    assert time_to_loss(curve, 1.0) is None
