"""`{{ amount|money }}`: an amount of money as every page shows it.

One rule for every page (a builtin, so no template loads it): cents when that is exact
("12.50"), else every digit the ledger keeps ("0.000125"), so a small budget or a per-request
cost never reads "0.00". The rule itself is billing.money.shown_text (views that format money
in Python call it too).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django import template

from billing.money import shown_text

register = template.Library()
NONE = "\u2014"


@register.filter
def money(value: object) -> str:
    """The amount at the ledger's precision, trailing zeros past the cents dropped; "—" for none."""
    if value is None or value == "":
        return NONE
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value))
        return shown_text(amount)
    except (InvalidOperation, ValueError):
        return NONE
