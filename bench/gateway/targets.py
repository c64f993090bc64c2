"""`bench gateway`'s targets: ratios to the same run's direct call to the mock."""

from __future__ import annotations

from typing import Any

# Issue 28's targets, as ratios to direct_p50_ms, the same run's call straight to the mock (this
# machine's speed drifts 2x from day to day; the ratios do not): figure -> (ratio key, the
# ratio's upper bound). The rate is a lower bound on the gateway's share of the mock's own
# rate at 16 clients; the CPU target is absolute (ms per request, web + PostgreSQL + Redis).
RATIO_TARGETS: dict[str, tuple[str, float]] = {
    "gateway_overhead_p50_ms": ("gateway_overhead_to_direct", 3.0),
    "gateway_overhead_p99_ms": ("gateway_overhead_p99_to_direct", 10.0),
    "failover_overhead_p50_ms": ("failover_overhead_to_direct", 4.0),
    "circuit_open_overhead_p50_ms": ("circuit_open_overhead_to_direct", 3.0),
    "limits_and_budgets_added_paired_p50_ms": ("limits_and_budgets_added_to_direct", 0.5),
    "stream_ttfb_overhead_p50_ms": ("stream_ttfb_overhead_to_direct", 3.0),
}


def target_ratios(out: dict[str, Any]) -> dict[str, Any]:
    """Each target figure over direct_p50_ms, and whether each target is met."""
    ratios: dict[str, Any] = {}
    met: dict[str, bool] = {}
    for figure, (key, bound) in RATIO_TARGETS.items():
        ratios[key] = round(out[figure] / out["direct_p50_ms"], 2)
        met[key] = ratios[key] <= bound
    ratios["gateway_rps_16_to_direct"] = round(out["gateway_rps_16"] / out["direct_rps_16"], 3)
    met["gateway_rps_16_to_direct"] = (
        ratios["gateway_rps_16_to_direct"] >= 0.5 and not out["gateway_rps_16_errors"]
    )
    met["gateway_cpu_ms_per_request"] = out["gateway_cpu_ms_per_request"] <= 2.0
    return {**ratios, "targets_met": met}
