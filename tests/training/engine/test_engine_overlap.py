"""Overlap τ (Streaming DiLoCo, arXiv 2501.18512 sec. 2.3): a fragment's new version is taken
τ inner steps after its push, by the learner rule the simulator and the orchestrator share."""

from __future__ import annotations

import pytest

from training.engine.config import CompressionConfig, InnerConfig, StreamingConfig
from training.engine.data import BatchSampler
from training.engine.learner import Learner
from training.engine.model import build_model
from training.engine.simulator import LearnerSpec, NetworkConfig, SimConfig, Simulator

INNER = InnerConfig(lr=3e-3, warmup_steps=3, total_steps=40, batch_size=4)


def _learner(cfg, corpus):
    init = {n: p.detach().clone() for n, p in build_model(cfg, seed=0).named_parameters()}
    return Learner(
        learner_id=0,
        model_cfg=cfg,
        inner=INNER,
        fragments=[[n for n in init if "blocks.0" in n], [n for n in init if "blocks.0" not in n]],
        sampler=BatchSampler(corpus.train, block_size=cfg.block_size, batch_size=4, seed=0),
        init=init,
        device="cpu",
    )


def test_a_version_received_inside_the_overlap_window_is_adopted_when_the_window_closes(
    tiny_cfg, stdlib_small
):
    learner = _learner(tiny_cfg, stdlib_small)
    learner.train(5)
    learner.make_delta(0)  # pushed after step 5: with τ = 3 the version may come in at step 8
    merged = {n: learner.params[n].detach().clone() + 0.01 for n in learner.fragments[0]}
    learner.receive_full(0, merged, version=1)
    opened = []
    for _ in range(4):
        opened.append(learner.may_adopt(0, overlap=3))
        learner.train_step()
    assert opened == [False, False, False, True]  # steps 5, 6, 7 inside; step 8 closes it
    assert learner.base_version[0] == 0
    assert learner.adopt_held(0, how="mix", alpha=0.5) and learner.base_version[0] == 1
    assert not learner.adopt_held(0)  # nothing newer held
    assert learner.may_adopt(1, overlap=3)  # a fragment never pushed is never held back


@pytest.mark.parametrize("tau", [0, 3])
def test_decoupled_simulated_learners_adopt_tau_steps_after_their_push(
    tau, tiny_cfg, stdlib_small, tiny_eval
):
    cfg = SimConfig(
        model=tiny_cfg,
        inner=INNER,
        learners=(LearnerSpec(batch_size=4),) * 2,
        h=5,
        mode="decoupled",
        streaming=StreamingConfig(overlap=tau),
        compression=CompressionConfig(kind="int8"),
        network=NetworkConfig(bandwidth=1e12, latency=0.01),  # versions land within the step
        max_steps=20,
    )
    sim = Simulator(cfg, stdlib_small, tiny_eval[:2], device="cpu")
    seen: list[tuple[int, int]] = []  # (steps since the push, version) at each adoption
    for rt in sim.rts:
        learner = rt.learner
        original = learner.adopt

        def adopt(fragment, params, version, *, how="replace", alpha=0.0, _l=learner, _o=original):
            seen.append((_l.step_count - (_l.pushed_at[fragment] or 0), version))
            _o(fragment, params, version, how=how, alpha=alpha)

        learner.adopt = adopt  # type: ignore[method-assign]
    sim.run()
    assert len(seen) >= 4
    assert {since for since, _ in seen} == {tau}
