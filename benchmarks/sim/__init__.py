"""Benchmarks of the sim backend itself: how fast it simulates."""
