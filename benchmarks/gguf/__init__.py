"""Benchmarks of the gguf (llama.cpp) backend and of llama.cpp itself."""
