"""The CPU paths on an ordinary CPU: bf16 where oneDNN cannot run it, kernels built for another instruction set."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from prefillbench.backends.torch import linear

ROOT = Path(__file__).resolve().parents[1]


def test_onednn_is_offered_only_in_the_dtypes_it_runs_here():
    # What the probe says is what the CPU does: a weight it accepts multiplies, one it refuses raises.
    for dtype in (torch.float32, torch.bfloat16):
        w = torch.randn(16, 32).to(dtype)
        runs = linear.onednn_runs(dtype)
        assert linear.onednn_applies(w) == runs
        try:
            torch.ops.mkldnn._reorder_linear_weight(w)
            reordered = True
        except RuntimeError:
            reordered = False
        assert runs <= reordered  # never offered where the reorder itself raises
    assert linear.onednn_runs(torch.float32)


def test_a_bfloat16_backend_runs_with_onednn_capped_at_avx2_and_stays_close_to_float32():
    # ONEDNN_MAX_CPU_ISA is read when oneDNN first runs, so the run needs a process of its own.
    script = textwrap.dedent("""
        import numpy as np, torch
        from prefillbench.backends.torch.backend import TorchBackend
        from prefillbench.backends.torch import linear
        from prefillbench.step import DecodeToken, PrefillChunk, Step
        from tiny_models import reference_logits, tiny_model
        model, reference = tiny_model("llama")
        backend = TorchBackend(model.to(torch.bfloat16), "tiny")
        backend.prepare(2, 64, 64)
        prompt = list(range(3, 40))
        backend.execute(Step(prefills=(PrefillChunk(0, tuple(prompt), 0, True),)))
        got = backend.execute(Step(decodes=(DecodeToken(0, 7, len(prompt)),)), return_logits=True).logits[0]
        exact = reference_logits(reference, prompt + [7])[-1].numpy()
        assert np.abs(got - exact).max() < backend.logit_tolerance().max_abs, np.abs(got - exact).max()
        chosen = set(linear_name for linear_name in backend.linear_kernels.choice.values())
        assert linear.onednn_runs(torch.bfloat16) or "onednn_packed" not in chosen, chosen
        print("ok", sorted(chosen))
    """)
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")
