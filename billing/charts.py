"""Plotly figures built in Python from ledger data.

Pages embed the figure as a <div> and load plotly.js from the copy that ships
inside the `plotly` package (stack.views.plotly_js), never from a CDN.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import date
from decimal import Decimal

from billing.selectors import DailySpend

_CONFIG = {"displaylogo": False, "responsive": True}


def _to_div(figure: object, div_id: str) -> str:
    return figure.to_html(  # type: ignore[attr-defined, no-any-return]
        full_html=False, include_plotlyjs=False, div_id=div_id, config=_CONFIG
    )


def spend_per_provider_chart(rows: Sequence[DailySpend], days: Sequence[date]) -> str:
    """Stacked bars: spend per provider per day (one trace per provider and currency)."""
    import plotly.graph_objects as go  # lazily: large, and only the pages that draw a chart need it

    by_series: dict[str, dict[date, Decimal]] = defaultdict(dict)
    for row in rows:
        by_series[f"{row.provider} ({row.currency})"][row.day] = row.amount
    figure = go.Figure()
    for name, per_day in sorted(by_series.items()):
        figure.add_bar(
            name=name,
            x=[d.isoformat() for d in days],
            # Plotly needs numbers; the Decimal ledger values are only rounded for drawing.
            y=[float(per_day.get(d, Decimal("0"))) for d in days],
        )
    figure.update_layout(
        barmode="stack",
        height=340,
        margin={"l": 50, "r": 10, "t": 30, "b": 60},
        title={"text": "Spend per provider per day", "font": {"size": 14}},
        yaxis={"title": {"text": "amount"}, "rangemode": "tozero"},
        showlegend=True,
        legend={"orientation": "h"},
    )
    return _to_div(figure, "spend-chart")
