"""Checks, before the numerical tests' second pass, that the lower ISA the Makefile forces is what runs: torch's ATen
kernels at AVX2, MKL's (torch's BLAS) AVX2 code path, OpenBLAS' (numpy's and scipy's) Haswell kernels, numpy's
SIMD loops below AVX-512. An AVX-512 machine then also computes what an AVX2 one does; a pass that silently ran
AVX-512 kernels would prove nothing. Exits 1 with a line naming what did not take."""
from __future__ import annotations

import os
import subprocess
import sys


def main() -> int:
    import torch
    from threadpoolctl import threadpool_info

    import numpy  # noqa: F401  (its OpenBLAS)
    import scipy.linalg  # noqa: F401  (scipy's own OpenBLAS)

    bad = []
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        bad.append(f"torch's ATen kernels run at {torch.backends.cpu.get_cpu_capability()}, not AVX2")
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    # numpy dispatches its loops by these groups; X86_V4 is its AVX-512 baseline (SKX)
    above = [f for f in __cpu_dispatch__ if f not in ("X86_V2", "X86_V3") and __cpu_features__.get(f)]
    if above:
        bad.append(f"numpy's SIMD loops may run {', '.join(above)}: NPY_DISABLE_CPU_FEATURES did not take")
    for pool in threadpool_info():
        if pool.get("internal_api") == "openblas" and pool.get("architecture") != "Haswell":
            bad.append(f"{pool.get('filepath')}: OpenBLAS runs its {pool.get('architecture')} kernels, not Haswell")
    # MKL says which code path it dispatched to in its verbose banner, on its first call
    code = "import torch; a = torch.randn(64, 64); a @ a"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "MKL_VERBOSE": "1"}, timeout=120).stdout
    banner = next((line for line in out.splitlines() if "oneMKL" in line or "Intel(R) MKL" in line), "")
    # on AMD parts MKL may name another path below AVX2; what must not run is AVX-512 (or AMX)
    if torch.backends.mkl.is_available() and (not banner or "AVX-512" in banner or "AMX" in banner):
        bad.append(f"MKL's code path is above AVX2: {banner.strip() or 'no MKL_VERBOSE banner'}")
    for line in bad:
        print(f"lower ISA pass: {line}", file=sys.stderr)
    if not bad:
        print(f"lower ISA pass: torch {torch.backends.cpu.get_cpu_capability()}, MKL below AVX-512, OpenBLAS Haswell, numpy "
              "below AVX-512")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
