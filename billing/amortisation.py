"""A self-hosted model's serving price with its training cost in it (issue 18, item 4).

Pure Decimal arithmetic (no Django), used for a trained model's deployments (billing.selfhosted,
shown on the inference pages) and for each model version of a build-or-buy run
(decisions.buildbuy.maths):

    amortised $/1M = hosting $/1M + (training cost / horizon months) / (tokens a month / 1e6)

that is, the training cost spread evenly over the tokens the horizon is expected to serve.
"""

from __future__ import annotations

from decimal import Decimal

MILLION = Decimal(1_000_000)
PER_1M = Decimal("0.000001")


def amortised_per_1m(
    *,
    hosting_per_1m: Decimal,
    training_cost: Decimal,
    horizon_months: int,
    volume_tokens_per_month: Decimal | int,
) -> Decimal:
    """Serving price per 1M tokens with the training cost spread over the horizon's tokens."""
    monthly_training = training_cost / Decimal(horizon_months)
    return (hosting_per_1m + monthly_training / (Decimal(volume_tokens_per_month) / MILLION)).quantize(PER_1M)
