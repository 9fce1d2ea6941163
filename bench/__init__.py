"""Benchmark drivers (``make bench-structures``, ``make bench-layers``); results in ``results/bench/``."""
