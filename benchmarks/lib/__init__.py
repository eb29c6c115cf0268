"""Helpers the benchmarks share: how they run (cli), how they time (timing), the device's limits (limits),
model shapes and costs (models), the tables of a switch timed both ways (both_ways), profiles (profiling)."""
