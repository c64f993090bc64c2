"""Plotly figures for a training run, built in Python and sent to the page as JSON.

The page draws them with Plotly.newPlot and, while the run is live, fetches the same figures from
/training/<id>/metrics.json every few seconds and redraws them with Plotly.react.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

_LAYOUT: dict[str, Any] = {
    "height": 300,
    "margin": {"l": 55, "r": 10, "t": 35, "b": 45},
    "legend": {"orientation": "h"},
}

CHARTS = ("loss_tokens", "loss_wall", "loss_money", "train_loss", "bytes", "merged")
MONEY_CHARTS = frozenset({"loss_money"})  # drawn only for those who may see costs


def charts_shown(*, costs: bool) -> tuple[str, ...]:
    """The run page's charts, less the money ones for a caller who may not see costs."""
    return CHARTS if costs else tuple(c for c in CHARTS if c not in MONEY_CHARTS)


def _figure(traces: list[Any], title: str, x: str, y: str, **layout: Any) -> dict[str, Any]:
    import plotly.graph_objects as go  # lazily: ~0.1 s to import; only chart pages pay it

    figure = go.Figure()
    for trace in traces:
        figure.add_trace(trace)
    figure.update_layout(
        title={"text": title, "font": {"size": 14}},
        xaxis={"title": {"text": x}},
        yaxis={"title": {"text": y}},
        **_LAYOUT,
        **layout,
    )
    # Through JSON so numpy arrays and Decimals become plain lists and numbers.
    return json.loads(figure.to_json())  # type: ignore[no-any-return]


def run_figures(series: dict[str, Any], *, costs: bool = True) -> dict[str, dict[str, Any]]:
    """Every chart of the run page from training.run_selectors.run_metric_series (without the
    money charts when `costs` is false: registry.auth.roles.can_see_costs)."""
    import plotly.graph_objects as go  # lazily: ~0.1 s to import; only chart pages pay it

    versions = [v for v in series["versions"] if v["eval_loss"] is not None]
    loss = [v["eval_loss"] for v in versions]

    def loss_against(x: list[Any], name: str) -> Any:
        return go.Scatter(x=x, y=loss, mode="lines+markers", name=name)

    figures = {
        "loss_tokens": _figure(
            [loss_against([v["tokens_total"] for v in versions], "eval loss")],
            "Global eval loss against tokens", "tokens merged", "eval loss",
        ),
        "loss_wall": _figure(
            [loss_against([v["wall_seconds"] for v in versions], "eval loss")],
            "Global eval loss against wall time", "seconds since start", "eval loss",
        ),
        "loss_money": _figure(
            # Plotly needs numbers; the ledger's Decimal is only rounded for drawing.
            [loss_against([float(v["cost_so_far"]) for v in versions], "eval loss")],
            "Global eval loss against money", "cost so far", "eval loss",
        ),
        "train_loss": _figure(
            [
                go.Scatter(x=s["step"], y=s["loss"], mode="lines", name=f"learner {idx}")
                for idx, s in series["train_loss"].items()
            ],
            "Train loss per learner", "inner step", "train loss",
        ),
        "bytes": _figure(
            [go.Bar(x=[f"f{v['fragment']} v{v['version']}" for v in series["versions"]],
                    y=[v["bytes_in"] for v in series["versions"]], name="bytes in")],
            "Bytes moved per sync", "fragment / version", "bytes",
        ),
        "merged": _figure(
            [go.Bar(x=[f"f{v['fragment']} v{v['version']}" for v in series["versions"]],
                    y=[len(v["learners_merged"]) for v in series["versions"]], name="learners merged")],
            "Learners merged per version", "fragment / version", "learners",
        ),
    }  # fmt: skip
    return {name: figure for name, figure in figures.items() if name in charts_shown(costs=costs)}


def loss_curve_chart(curve: Sequence[Sequence[float]], title: str) -> str:
    """A probe job's train loss against step, as an embeddable <div>."""
    import plotly.graph_objects as go  # lazily: ~0.1 s to import; only chart pages pay it

    figure = go.Figure()
    figure.add_scatter(
        x=[p[0] for p in curve], y=[p[1] for p in curve], mode="lines+markers", name="train loss"
    )
    figure.update_layout(
        height=300,
        margin={"l": 50, "r": 10, "t": 30, "b": 40},
        title={"text": title, "font": {"size": 14}},
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": "loss (nats/byte)"}},
    )
    return figure.to_html(  # type: ignore[no-any-return]
        full_html=False,
        include_plotlyjs=False,
        div_id="loss-chart",
        config={"displaylogo": False, "responsive": True},
    )
