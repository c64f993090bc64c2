"""Training: probe jobs and multi-cluster DiLoCo runs (the pure-torch engine is in training/engine).

This file stays empty of imports: importing training.engine (used without Django by the engine
benchmark and local serving) runs it first.
"""
