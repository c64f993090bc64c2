"""A Plotly chart of eval loss against bytes sent per learner, from a bench result.

Plotly is imported here only, so the engine itself needs nothing but torch. The HTML embeds
the plotly.js that ships inside the ``plotly`` package (no CDN).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def figure(result: dict[str, Any]) -> Any:
    import plotly.graph_objects as go  # lazily: the engine itself needs only torch

    fig = go.Figure()
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in result["runs"]:
        # Equal-token runs only: the straggler, failure and Protocol A runs answer other questions.
        if run.get("name", "").startswith(("straggler", "failure", "diloco_m4_protocol_a")):
            continue
        if run.get("method") in ("diloco", "streaming") and isinstance(
            run.get("bytes_sent_per_learner"), int | float
        ):
            key = f"M={run['M']} {run['compression']}" + (" streaming" if run["P"] > 1 else "")
            groups.setdefault(key, []).append(run)
    for key, runs in sorted(groups.items()):
        runs.sort(key=lambda r: r["bytes_sent_per_learner"])
        fig.add_trace(
            go.Scatter(
                x=[r["bytes_sent_per_learner"] for r in runs],
                y=[r["eval_loss"] for r in runs],
                mode="markers+lines",
                name=key,
                text=[f"{r['name']} H={r['H']} outer lr={r['outer_lr']}" for r in runs],
            )
        )
    dp = next((r for r in result["runs"] if r.get("method") == "data_parallel"), None)
    if dp is not None:
        for m, sent in dp["bytes_sent_per_learner"].items():
            fig.add_trace(
                go.Scatter(
                    x=[sent],
                    y=[dp["eval_loss"]],
                    mode="markers",
                    marker={"symbol": "x", "size": 12},
                    name=f"data-parallel, ring all-reduce M={m}",
                )
            )
    fig.update_layout(
        title="Eval loss of the global parameters vs bytes sent per learner",
        xaxis={"title": "bytes sent per learner", "type": "log"},
        yaxis={"title": "eval loss (nats/byte)"},
    )
    return fig


def write_chart(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure(result).write_html(str(path), include_plotlyjs=True, full_html=True)
