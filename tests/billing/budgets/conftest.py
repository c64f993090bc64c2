"""The cluster the budget tests bill, at PRICE an accelerator-hour."""

from __future__ import annotations

import pytest

from registry.models import Cluster
from tests.billing.budgets import PRICE
from tests.factories import make_cluster


@pytest.fixture
def cluster() -> Cluster:
    return make_cluster(price=PRICE)
