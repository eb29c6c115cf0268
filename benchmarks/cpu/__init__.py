"""Benchmarks of the torch backend's C kernels (prefillbench/backends/torch/cpu/), each against the torch path it replaces."""
