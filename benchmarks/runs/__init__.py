"""Benchmarks of whole engine runs, any backend."""
