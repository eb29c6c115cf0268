"""The GPU check, run here on the CPU with a tiny model: every row of its table comes out, from the same code
that runs on the GPU; its attention detector tells fused attention from the math path; bad input is one line."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.gpu import check
from benchmarks.gpu.table import rows_for
from benchmarks.lib import cli
from benchmarks.lib.profiling import attention_profile, attention_shaped_bmm, short_name

S = check.TINY_SIZES
#: The label every row of the tiny check starts with.
ROWS = ["device limits", "attention: prompt pp64", "attention: chunk 32 at 64", "attention: chunk + 2 decodes",
        "attention: decode x4", "pp64", "decode x1 at 64", "decode x2 at 64", "decode x4 at 64",
        "piggyback: chunk 32 + 2 decodes", "decode x4: context 32 / 128 (cache 256)",
        "chunked / sequential throughput, 6 x pp48+tg8", "TBT p99: sequential / chunked", "parity tests on cpu"]


def run_check(argv: list[str]) -> int:
    return check.main(cli.parser_for(check).parse_args(argv))


def table_rows(text: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0].strip(): [c.strip() for c in cells] for cells in rows[1:]}


def test_the_tiny_check_runs_end_to_end_on_the_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    code = run_check(["--device", "cpu", "--config", "tiny", "--max-seconds", "600",
                      "--parity-k", "test_context_overflow_is_a_clear_error"])
    out = capsys.readouterr().out
    assert code in (0, 1)  # on this CPU some GPU targets fail: the table is what is checked
    assert "at most" in out.splitlines()[1]  # the plan comes first, each section with its budget
    rows = table_rows(out)
    for label in ROWS:
        assert any(row.startswith(label) for row in rows), f"no row {label!r} in\n{out}"
    for label, cells in rows.items():
        assert not cells[1].startswith(("error", "not run")), f"{label}: {cells[1]}"
    assert rows["parity tests on cpu"][1].startswith("2 passed") and rows["parity tests on cpu"][-1] == "pass"
    kernels = rows["attention: prompt pp64"]
    assert "scaled_dot_product" in kernels[1] and kernels[2] == "no"
    written = table_rows((tmp_path / "gpu_check.md").read_text())
    assert written.keys() == rows.keys()


def test_every_row_is_in_the_table_even_when_nothing_ran():
    rows = rows_for({}, S, None, "cuda")
    labels = [r.check for r in rows]
    for label in ROWS[5:-1]:
        assert any(c.startswith(label) or label.startswith(c) for c in labels), label
    assert "parity tests on cuda" in labels
    assert all(r.passed is False for r in rows if r.target), [r.check for r in rows if r.passed is not False]


def test_the_detector_tells_the_math_kernel_from_a_fused_one():
    q, k, v = (torch.randn(1, 4, 32, 16) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH):
        math = attention_profile(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), torch.device("cpu"), 16)
    fused = attention_profile(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), torch.device("cpu"), 16)
    assert math.math and "aten::_scaled_dot_product_attention_math" in math.unfused
    assert not fused.math and fused.kernels == ["aten::_scaled_dot_product_flash_attention_for_cpu"]
    # Attention as two matmuls over a batch of heads is unfused too.
    scores = attention_profile(lambda: (q[0] @ k[0].transpose(1, 2)).softmax(-1) @ v[0], torch.device("cpu"), 16)
    assert scores.math and all(u.startswith("aten::bmm") for u in scores.unfused)


def test_what_counts_as_attention_shaped():
    assert attention_shaped_bmm([[32, 5, 128], [32, 128, 700]], 128)  # Q @ K^T
    assert attention_shaped_bmm([[], [32, 5, 700], [32, 700, 128]], 128)  # baddbmm's P @ V
    assert not attention_shaped_bmm([[1, 64, 1], [1, 1, 128]], 128)  # rotary's inv_freq @ positions
    assert short_name("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>, true>(Flash_fwd_params)") \
        == "pytorch_flash::flash_fwd_kernel"
    assert short_name("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*)") \
        == "at::native::cunn_SoftMaxForward"


@pytest.mark.parametrize("argv, message", [
    (["--device", "cuda", "--config", "tiny"], "sees no CUDA device"),
    (["--device", "cpu", "--config", "tiny", "--decodes", "1,x"], "--decodes takes a comma list of integers"),
    (["--device", "cpu", "--config", "tiny", "--long-context", "300"], "--short-context < --long-context < --cache-len"),
    (["--device", "cpu", "--config", "tiny", "--cache-len", "4096", "--long-context", "2000"], "need 4096 positions"),
    (["--device", "cpu", "--config", "tiny", "--k", "0"], "--k must be positive"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        run_check(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
