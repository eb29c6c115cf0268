"""The GPU check, run here on the CPU with a tiny model: every row of its table comes out, from the same code
that runs on the GPU, and $OUT holds it after every section; a section that raises is one row and the next
runs, a lost device stops the rest with its reason, the watchdog writes the table and stops the run at the
deadline; its attention detector tells fused attention from the math path and a blind replay from a seen one;
repetitions are sized after an untimed call; bad input is one line."""
from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.gpu import check, sections
from benchmarks.gpu.table import rows_for
from benchmarks.lib import cli
from benchmarks.lib.profiling import attention_profile, attention_shaped_bmm, saw_kernels, short_name
from benchmarks.lib.timing import Clock

S = check.TINY_SIZES
#: The label every row of the tiny check starts with.
ROWS = ["device limits", "attention: prompt pp64", "attention: chunk 32 at 64", "attention: chunk + 2 decodes",
        "attention: decode x4", "pp64", "decode x1 at 64", "decode x2 at 64", "decode x4 at 64",
        "piggyback: chunk 32 + 2 decodes", "decode x4: context 32 / 128 (cache 256)",
        "chunked / sequential throughput, 6 x pp48+tg8", "TBT p99: sequential / chunked", "parity tests on cpu", "compiles"]
#: A quick tiny check: no parity tests, few reps.
QUICK = ["--device", "cpu", "--config", "tiny", "--parity-tests", "", "--reps", "1", "--requests", "3"]


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
    first = out.splitlines()[0]
    assert "torch " in first and "Triton " in first and "CUDA " in first  # the versions
    assert "at most" in out.splitlines()[1]  # the plan comes first, each section with its budget
    rows = table_rows(out)
    for label in ROWS:
        assert any(row.startswith(label) for row in rows), f"no row {label!r} in\n{out}"
    for label, cells in rows.items():
        assert not cells[1].startswith(("error", "not run")), f"{label}: {cells[1]}"
    assert rows["parity tests on cpu"][1].startswith("2 passed") and rows["parity tests on cpu"][-1] == "pass"
    assert rows["compiles"][-1] == "pass" and "0 inside steps" in rows["compiles"][1]
    kernels = rows["attention: prompt pp64"]
    assert "scaled_dot_product" in kernels[1] and kernels[2] == "no"
    # What comes back from a device machine: at most 8 files, none in a folder.
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert files == sorted(check.Output.FILES) and all(p.is_file() for p in tmp_path.iterdir())
    written = table_rows((tmp_path / "gpu_check.md").read_text())
    assert written.keys() == rows.keys()
    assert "<testsuite" in (tmp_path / "parity.xml").read_text() and "2 passed" in (tmp_path / "parity.log").read_text()
    # The profiler runs first, right after the one cache is prepared; the timed sections after the parity tests.
    log = (tmp_path / "check.log").read_text()
    order = [log.index(f"{name}...") for name in (check.CACHE, check.PROFILER, check.LIMITS, check.PROMPT, check.WORKLOAD)]
    assert order == sorted(order) and log.index("waiting for the parity tests") < log.index(f"{check.LIMITS}...")


def _quick(tmp_path, monkeypatch, capsys, *extra: str) -> tuple[int, dict[str, list[str]], str]:
    monkeypatch.setenv("OUT", str(tmp_path))
    code = run_check(QUICK + list(extra))
    out = capsys.readouterr().out
    return code, table_rows((tmp_path / "gpu_check.md").read_text()), out


def test_a_section_that_raises_is_one_failed_row_and_the_next_sections_run(tmp_path, monkeypatch, capsys):
    seen = []

    def broken(setup, seconds):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore text")

    def written_after(name):
        real = getattr(sections, name)

        def call(setup, seconds):  # $OUT already holds the failed section's row when the next one starts
            seen.append((tmp_path / "gpu_check.md").read_text())
            return real(setup, seconds)
        return call

    monkeypatch.setattr(sections, "prefill", broken)
    monkeypatch.setattr(sections, "decode_steps", written_after("decode_steps"))
    code, rows, _ = _quick(tmp_path, monkeypatch, capsys)
    assert code == 1
    assert rows["pp64"][1] == "error: RuntimeError: CUDA error: an illegal memory access was encountered" and rows["pp64"][-1] == "FAIL"
    assert not rows["decode x1 at 64"][1].startswith(("error", "not run"))  # the context survived: the next sections ran
    assert not rows["TBT p99: sequential / chunked"][1].startswith(("error", "not run"))
    assert seen and "| pp64 | error: RuntimeError" in seen[0] and "in progress" in seen[0]


def test_after_a_lost_device_the_remaining_sections_say_why(tmp_path, monkeypatch, capsys):
    def broken(setup, seconds):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(sections, "decode_steps", broken)
    probes = []
    monkeypatch.setattr(check, "device_alive", lambda device: probes.append(device) or "AcceleratorError: CUDA error: unspecified launch failure")
    code, rows, _ = _quick(tmp_path, monkeypatch, capsys)
    assert code == 1
    assert rows["decode x1 at 64"][1].startswith("error: RuntimeError")
    lost = "not run: the device was lost (AcceleratorError: CUDA error: unspecified launch failure)"
    assert rows["decode x4: context 32 / 128 (cache 256)"][1] == lost
    assert rows["TBT p99: sequential / chunked"][1] == lost
    assert rows["pp64"][-1] in ("pass", "FAIL") and not rows["pp64"][1].startswith(("error", "not run"))
    assert probes == ["cpu"]  # probed once, after the error


@pytest.fixture
def ctrl_c_raises():
    """The watchdog interrupts the main thread as Ctrl-C does: that needs Python's own SIGINT handler, which a test
    earlier in the session (a pool, an event loop) may have left replaced."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_the_watchdog_writes_the_table_and_stops_the_run_at_the_deadline(tmp_path, monkeypatch, capsys, ctrl_c_raises):
    def hangs(*args, **kwargs):
        for _ in range(600):  # a build that would run past the budget
            time.sleep(0.1)

    monkeypatch.setattr(check, "build_from_config", hangs)
    exits = []
    monkeypatch.setattr(check, "_hard_exit", exits.append)  # never the process's end inside pytest
    t0 = time.perf_counter()
    code, rows, out = _quick(tmp_path, monkeypatch, capsys, "--max-seconds", "5")
    assert code == check.WATCHDOG_EXIT and time.perf_counter() - t0 < 30
    table = (tmp_path / "gpu_check.md").read_text()
    assert "stopped by the watchdog at 5 s, in: model build" in table and "stopped by the watchdog" in out
    assert exits == []  # the interrupt stopped the section: no hard exit was needed
    for label in ROWS[5:]:  # every target's row, with why it has no value
        assert any(row.startswith(label) or label.startswith(row) for row in rows), label
    assert rows["pp64"][1] == "not run"


def test_a_main_thread_that_does_not_stop_is_ended_all_the_same(tmp_path, ctrl_c_raises):
    exits = []
    run = check.Run(SimpleNamespace(device="cpu"), check.TINY_SIZES, check.Budget(0.2), check.Output(str(tmp_path)),
                    lambda line: None, ["header"])
    interrupted = threading.Event()
    try:
        watchdog = check.Watchdog(run, 0.2, None, grace=0.3, hard_exit=exits.append)
        for _ in range(100):
            time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted.set()
    watchdog.thread.join(5)
    assert interrupted.is_set() and exits == [check.WATCHDOG_EXIT]  # finish() never came: the hard exit
    assert "stopped by the watchdog" in (tmp_path / "gpu_check.md").read_text()


def test_repetitions_are_sized_after_an_untimed_first_call():
    calls = []

    def step():
        time.sleep(1.0 if not calls else 0.001)  # the first call compiles
        calls.append(1)

    times = sections.time_sized({"step": step}, 0.5, Clock(torch.device("cpu")), max_reps=50)
    assert len(times["step"].seconds) >= 20 and max(times["step"].seconds) < 0.5


def test_a_profile_of_copies_alone_is_blind():
    cuda, cpu = DeviceType.CUDA, DeviceType.CPU
    event = lambda key, device: SimpleNamespace(key=key, device_type=device)  # noqa: E731
    assert not saw_kernels([event("Memcpy HtoD (Pageable -> Device)", cuda), event("Memset (Device)", cuda),
                            event("cudaGraphLaunch", cpu)])
    assert saw_kernels([event("Memcpy DtoD", cuda), event("triton_tem_fused_flex_decoding_0", cuda)])


def test_every_row_is_in_the_table_even_when_nothing_ran():
    rows = rows_for({}, S, None, "cuda")
    labels = [r.check for r in rows]
    for label in ROWS[5:-2]:
        assert any(c.startswith(label) or label.startswith(c) for c in labels), label
    assert "parity tests on cuda" in labels and "compiles" in labels
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
