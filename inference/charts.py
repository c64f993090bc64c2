"""Plotly figures of the inference pages, built in Python and drawn with the bundled plotly.js."""

from __future__ import annotations

from collections.abc import Sequence

from inference.stats_selectors import DeploymentStats

_CONFIG = {"displaylogo": False, "responsive": True}


def cost_quality_chart(stats: Sequence[DeploymentStats]) -> str | None:
    """Scatter of $/1M tokens (blended 3:1) against mean quality, one point per deployment, with
    the Pareto frontier drawn as a line. None when no deployment has both figures."""
    import plotly.graph_objects as go  # slow to import: only the pages draw charts

    points = [s for s in stats if s.blended_per_1m is not None and s.quality is not None]
    if not points:
        return None
    figure = go.Figure()
    figure.add_scatter(
        name="deployments",
        mode="markers+text",
        # Plotly needs numbers; the Decimal prices are only rounded for drawing.
        x=[float(s.blended_per_1m or 0) for s in points],
        y=[s.quality for s in points],
        text=[s.deployment.slug for s in points],
        textposition="top center",
        marker={
            "size": 11,
            "color": ["#1f6feb" if s.on_frontier else "#9aa4b2" for s in points],
        },
        hovertemplate="%{text}<br>$%{x:.4f} / 1M tokens<br>quality %{y:.3f}<extra></extra>",
    )
    frontier = sorted((s for s in points if s.on_frontier), key=lambda s: (s.blended_per_1m, s.quality))
    figure.add_scatter(
        name="Pareto frontier",
        mode="lines",
        x=[float(s.blended_per_1m or 0) for s in frontier],
        y=[s.quality for s in frontier],
        line={"color": "#1f6feb", "dash": "dot"},
        hoverinfo="skip",
    )
    figure.update_layout(
        height=360,
        margin={"l": 60, "r": 10, "t": 30, "b": 50},
        title={"text": "Cost versus quality per deployment", "font": {"size": 14}},
        xaxis={"title": {"text": "$ per 1M tokens (input:output 1:3)"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "mean quality"}, "range": [0, 1.05]},
        legend={"orientation": "h"},
    )
    return figure.to_html(  # type: ignore[no-any-return]
        full_html=False, include_plotlyjs=False, div_id="cost-quality-chart", config=_CONFIG
    )
