"""The build-or-buy panel's Plotly figure, built in Python from the report (as training.charts)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any


def build_or_buy_figure(report: dict[str, Any]) -> dict[str, Any]:
    """Quality against money spent: one line of scored versions per workflow, one point per API
    deployment (at the money the fit says reaches its quality, or at the spend so far when that
    cannot be said), and the forecast to reach the best API with its interval as an error bar."""
    import plotly.graph_objects as go  # lazily: ~0.1 s to import; only pages with the panel pay it

    figure = go.Figure()
    spent = Decimal(report["run_spend"])
    for doc in report["workflows"]:
        slug = doc["workflow"]
        figure.add_trace(
            go.Scatter(
                x=[float(Decimal(p["cost"])) for p in doc["points"]],
                y=[float(Decimal(p["quality"])) for p in doc["points"]],
                mode="lines+markers",
                name=f"{slug}: trained versions",
            )
        )
        forecast = doc["forecast_best_api"] or {}
        for api in doc["apis"]:
            at = spent
            if api["deployment"] == doc["best_api"] and forecast.get("cost"):
                at = Decimal(forecast["cost"])
            price = api["price_per_1m_tokens"] or "unpriced"
            figure.add_trace(
                go.Scatter(
                    x=[float(at)],
                    y=[float(Decimal(api["quality"]))],
                    mode="markers+text",
                    marker={"symbol": "diamond", "size": 11},
                    text=[f"{api['deployment']} ({price}/1M)"],
                    textposition="top center",
                    name=f"{slug}: {api['deployment']}",
                )
            )
        if (
            forecast.get("cost")
            and forecast.get("low")
            and forecast.get("high")
            and not forecast.get("already_met")
        ):
            cost = Decimal(forecast["cost"])
            figure.add_trace(
                go.Scatter(
                    x=[float(cost)],
                    y=[float(Decimal(forecast["target_quality"]))],
                    mode="markers",
                    marker={"symbol": "x", "size": 12},
                    error_x={
                        "type": "data",
                        "symmetric": False,
                        "array": [float(Decimal(forecast["high"]) - cost)],
                        "arrayminus": [float(cost - Decimal(forecast["low"]))],
                    },
                    name=f"{slug}: forecast to reach {doc['best_api']}",
                )
            )
    figure.update_layout(
        title={"text": "Quality against money spent (build or buy)", "font": {"size": 14}},
        xaxis={"title": {"text": f"money spent on the run ({report['currency']})"}, "type": "log"},
        yaxis={"title": {"text": "mean eval score"}, "range": [0, 1.05]},
        height=340,
        margin={"l": 55, "r": 10, "t": 35, "b": 45},
        legend={"orientation": "h"},
    )
    return json.loads(figure.to_json())  # type: ignore[no-any-return]
