"""Benchmarks of the engine's own loop (prefillbench/engine/): what it costs per step, apart from the backends."""
