"""The check for a machine with a CUDA GPU: python -m benchmarks.gpu.check (or benchmarks/gpu/check.sh)."""
