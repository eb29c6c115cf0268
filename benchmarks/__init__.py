"""prefillbench's benchmarks, one module each: `python -m benchmarks.<group>.<name>` from the repository root.

Groups: `torch` (the torch backend's steps), `cpu` (its C kernels, each against what it replaced), `gguf`
(the llama.cpp backend), `runs` (whole engine runs), `gpu` (the check for a CUDA machine); shared helpers
in `lib`. The README beside this file lists each benchmark and its command.
"""
