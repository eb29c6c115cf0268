"""The CPU paths on an ordinary CPU: bf16 where oneDNN cannot run it, kernels built for another instruction set."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from prefillbench.backends.torch import linear
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.backends.torch.cpu import build
from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.step import DecodeToken, PrefillChunk, Step
from kernel_builds import forget_build
from parity import assert_logits_match
from tiny_models import reference_logits, tiny_model

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


KERNELS = (cpu_decode_attention.KERNEL, cpu_few_rows.KERNEL, cpu_layer_ops.KERNELS, cpu_prefill_attention.KERNEL)


@pytest.mark.parametrize("target", ["x86-64-v2", "x86-64-v3"])
def test_kernels_built_for_an_ordinary_cpu_give_a_plain_forwards_logits(target, monkeypatch, tmp_path):
    # Built without AVX-512, every kernel runs its plain C branch, the one a laptop gets.
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 targets")
    monkeypatch.setenv(build.MARCH_VARIABLE, target)
    for kernel in KERNELS:
        forget_build(monkeypatch, kernel, tmp_path)
    model, reference = tiny_model("llama", hidden_size=256)  # heads of 64, as the prefill kernel takes
    backend = TorchBackend(model, "tiny")
    backend.prepare(2, 64, 64)
    for kernel in KERNELS:
        assert kernel.status() == "" and kernel.built_for == target and (kernel.fast_path is None or not kernel.fast())
        assert "avx512f" not in kernel.isa and ("avx2" in kernel.isa) == (target == "x86-64-v3")
    meta = backend.metadata()
    assert meta["kernel_build"] == f"-march={target}, avx512f absent: plain C loops"
    assert meta["prefill_attention"] == "compiled C kernel" and meta["decode_plan"] == "on, 1-8 decodes"
    prompts = [list(range(3, 40)), list(range(50, 61))]
    for seq, prompt in enumerate(prompts):
        got = backend.execute(Step(prefills=(PrefillChunk(seq, tuple(prompt), 0, True),)), return_logits=True).logits[seq]
        assert_logits_match(got, reference_logits(reference, prompt)[-1], reference, prompt)
    step = Step(decodes=tuple(DecodeToken(seq, 7, len(p)) for seq, p in enumerate(prompts)))
    got = backend.execute(step, return_logits=True).logits
    for seq, prompt in enumerate(prompts):
        assert_logits_match(got[seq], reference_logits(reference, prompt + [7])[-1], reference, prompt + [7])
    assert len(list(tmp_path.glob("prefillbench/*.so"))) == len(KERNELS)  # the target is in the cache key: built anew


def test_a_build_this_cpu_cannot_run_is_off_before_it_loads(monkeypatch, tmp_path):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 targets")
    monkeypatch.setenv(build.MARCH_VARIABLE, "x86-64-v4")
    forget_build(monkeypatch, cpu_prefill_attention.KERNEL, tmp_path)
    if "avx512f" in build.cpu_isa():
        assert cpu_prefill_attention.status() == "" and cpu_prefill_attention.KERNEL.fast()
    else:  # loading it would be an illegal instruction at the first call
        assert cpu_prefill_attention.status().startswith("off (built for -march=x86-64-v4, which needs avx512")
        assert not list(tmp_path.glob("prefillbench/*.so"))
        assert not cpu_prefill_attention.applies(torch.device("cpu"), torch.float32, 64)
