"""Billing's pages under /billing/, one module per area; billing.urls maps them."""
