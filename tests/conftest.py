import os
import sys
from pathlib import Path

# Tests import their helpers (tiny_models, ...) as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))

# The kernel tests check the C kernels' own paths: every kernel that builds runs, untimed. The timed
# decisions have tests of their own (test_cpu_isa), which set the variable as they need.
os.environ.setdefault("PREFILLBENCH_KERNEL_DECISION", "kernel")
