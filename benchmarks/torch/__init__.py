"""Benchmarks of the torch backend's steps (python -m benchmarks.torch.<name>)."""
