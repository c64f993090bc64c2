"""Short runs on the stdlib corpus through the simulator."""

from __future__ import annotations

from training.engine.config import CompressionConfig, InnerConfig, StreamingConfig, SyncerConfig
from training.engine.data import evaluate
from training.engine.model import build_model
from training.engine.simulator import LearnerSpec, SimConfig, Simulator

INNER = InnerConfig(lr=3e-3, warmup_steps=5, total_steps=40)


def test_diloco_on_stdlib_bytes_lowers_the_eval_loss(tiny_cfg, stdlib_small, tiny_eval):
    before = evaluate(build_model(tiny_cfg, seed=0), tiny_eval)
    cfg = SimConfig(
        model=tiny_cfg,
        inner=INNER,
        h=10,
        max_steps=40,
        learners=(LearnerSpec(batch_size=8), LearnerSpec(batch_size=8)),
        compression=CompressionConfig(kind="4bit"),
    )
    result = Simulator(cfg, stdlib_small, tiny_eval, device="cpu").run()
    assert result.publishes == 4
    assert result.eval_loss < before - 0.5
    assert result.tokens_merged == result.tokens_trained == 2 * 40 * 8 * tiny_cfg.block_size


def test_streaming_sends_one_fragment_at_a_time(tiny_cfg, stdlib_small, tiny_eval):
    def run(fragments):
        cfg = SimConfig(
            model=tiny_cfg,
            inner=INNER,
            h=10,
            max_steps=20,
            learners=(LearnerSpec(batch_size=4), LearnerSpec(batch_size=4)),
            streaming=StreamingConfig(fragments=fragments, overlap=2, alpha=0.5),
        )
        return Simulator(cfg, stdlib_small, tiny_eval, device="cpu").run()

    whole, streamed = run(1), run(2)
    assert whole.publishes == 2  # steps 10 and 20
    # Fragment 0 at steps 10 and 20, fragment 1 at 5 and 15 and its final flush at 20.
    assert streamed.publishes == 5
    assert streamed.tokens_merged == streamed.tokens_trained == whole.tokens_merged
    # Two blocks plus embeddings: the bigger fragment is ~60% of the tiny model.
    assert streamed.peak_push_bytes < 0.65 * whole.peak_push_bytes


def test_decoupled_learners_do_not_wait_for_a_straggler(tiny_cfg, stdlib_small, tiny_eval):
    specs = (LearnerSpec(batch_size=4), LearnerSpec(batch_size=4), LearnerSpec(batch_size=4, step_time=2.0))

    def run(mode, quorum):
        cfg = SimConfig(
            model=tiny_cfg,
            inner=INNER,
            h=5,
            learners=specs,
            mode=mode,
            time_limit=40.0,
            syncer=SyncerConfig(learners=3, quorum=quorum, grace=0.5),
        )
        return Simulator(cfg, stdlib_small, tiny_eval, device="cpu").run()

    barrier, decoupled = run("barrier", None), run("decoupled", 2)
    assert decoupled.publishes > 1.5 * barrier.publishes
    assert decoupled.tokens_merged > barrier.tokens_merged


def test_a_failed_learner_rejoins_and_the_quorum_keeps_merging(tiny_cfg, stdlib_small, tiny_eval):
    specs = (
        LearnerSpec(batch_size=4),
        LearnerSpec(batch_size=4),
        LearnerSpec(batch_size=4, fail_at=12.0, recover_at=30.0),
    )
    cfg = SimConfig(
        model=tiny_cfg,
        inner=INNER,
        h=5,
        learners=specs,
        mode="decoupled",
        time_limit=50.0,
        eval_every=1,
        syncer=SyncerConfig(learners=3, quorum=2, grace=0.5),
    )
    sim = Simulator(cfg, stdlib_small, tiny_eval, device="cpu")
    result = sim.run()
    merged_by = {}
    for entry in sim.syncer.history:
        for learner in entry["learners"]:
            merged_by.setdefault(learner, []).append(entry["time"])
    # Learner 2 contributes before it fails and after it rejoins, nothing while gone.
    assert any(t < 12.0 for t in merged_by[2]) and any(t > 30.0 for t in merged_by[2])
    assert not any(12.5 < t <= 30.0 for t in merged_by[2])
    # The others kept going meanwhile.
    assert any(12.0 < t < 30.0 for t in merged_by[0])
    assert result.tokens_lost > 0
    assert sim.rts[2].learner.total_tokens < sim.rts[0].learner.total_tokens


def test_fp4_both_ways_trains_about_as_well_as_fp32(tiny_cfg, stdlib_small, tiny_eval):
    def run(compression):
        cfg = SimConfig(
            model=tiny_cfg,
            inner=INNER,
            h=10,
            max_steps=40,
            learners=(LearnerSpec(batch_size=8), LearnerSpec(batch_size=8)),
            compression=compression,
            seed=0,
        )
        return Simulator(cfg, stdlib_small, tiny_eval, device="cpu").run()

    fp32 = run(CompressionConfig(kind="fp32"))
    fp4 = run(CompressionConfig(kind="fp4_e3m0"))  # down=None: versions come down in FP4 too
    fp4_ef = run(CompressionConfig(kind="fp4_e3m0", error_feedback=True))
    # Both directions travel in 4 bits (plus a bf16 scale per row): about 1/8 of fp32.
    assert fp4.bytes_up[0] < fp32.bytes_up[0] / 6 and fp4.bytes_down[0] < fp32.bytes_down[0] / 6
    for q in (fp4, fp4_ef):
        assert q.tokens_merged == fp32.tokens_merged
        # A loose bound on a 40-step run (the benchmark measures the real ratio).
        assert q.eval_loss / fp32.eval_loss < 1.05
