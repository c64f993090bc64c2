"""`bench training` reports each learner's store traffic from its chunks' measured counters."""

from __future__ import annotations

import pytest

from bench.training.runs import _per_learner
from tests.factories import fabricate_run
from training.models import LearnerChunk, TrainingLearner

pytestmark = pytest.mark.django_db


def test_store_bytes_are_summed_per_learner_over_every_chunk_and_life() -> None:
    run = fabricate_run()
    second = TrainingLearner.objects.get(run=run, index=1)
    first_chunk = LearnerChunk.objects.get(learner=second)
    # A later life of learner 1 (after a failover) adds to the same learner index.
    LearnerChunk.objects.create(
        learner=second, generation=1, seq=0, cluster=first_chunk.cluster, bytes_sent=5, bytes_received=70
    )
    assert _per_learner(run, "bytes_sent") == {0: 100, 1: 205}
    assert _per_learner(run, "bytes_received") == {0: 0, 1: 70}
