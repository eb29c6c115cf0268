"""The sim calibrated on a serving engine (bench.server_probes, `calibrate --backend server|llama-server`, and tune's
sim on a server): the probes' analysis on a stepping engine whose every step the sim's own cost model prices (the
fit must find that truth), the stub server's known pace recovered through HTTP, the command's refusals, tune
calibrating on the server itself, and an end-to-end run on the real llama-server."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace

import pytest
from processes import session_processes

from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.calibration import Point, calibration_specs, load_calibration
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.backends.sim.cost import Batch, CostModel
from prefillbench.bench import server_probes
from prefillbench.models import default_model_path
from prefillbench.sequence import Request

STUB = f"{sys.executable} -m prefillbench.backends.server.stub --port {{port}}"
#: llama.cpp on a CPU as the gguf calibration found it (decode attention far below the GEMMs, mixed steps dearer), its
#: memory roof low enough to bind the smaller decode batches (else the memory fraction would be unseen)
TRUTH = {"compute_fraction": 0.04, "memory_fraction": 0.1, "step_overhead_s": 0.003, "decode_attention_fraction": 0.05,
         "mixed_step_factor": 1.2}


def specs():
    return load_model_spec(default_model_path()), load_gpu_spec("CPU")


# ---- a stepping engine the sim prices: what the probes assume of a server --------------------------------------
@dataclass
class Streamed:
    request: Request
    sent: float
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    filled: int = 0


@dataclass
class Run:
    start: float
    end: float
    done: list
    stopped: bool = False


def stepping_engine(cost: CostModel, budget: int, apart: bool = False, slots: int = 256):
    """serve(requests, concurrency, watch) of an engine that steps as llama-server and vLLM do: every decode first,
    then prompt tokens up to the budget (the decodes counted in it), each step priced by `cost`. `apart`: a step
    holds prompts or decodes, never both (prompts first), as an engine whose prefill pauses the decodes. `slots`:
    the most it runs at once, whatever is sent (a server at --url has its own)."""

    def serve(requests, concurrency, watch=None):
        concurrency = min(concurrency, slots)
        t, pending, live, done = 0.0, list(requests), [], []
        open_loop = requests[0].arrival_s is not None
        while pending or live:
            while pending and len(live) < concurrency and (not open_loop or pending[0].arrival_s <= t):
                r = pending.pop(0)
                live.append(Streamed(r, r.arrival_s if open_loop else t))
            decodes = [s for s in live if s.token_times]
            prompts, room = [], budget - (0 if apart else len(decodes))
            for s in live:
                if not s.token_times and room > 0:
                    n = min(room, len(s.request.prompt) - s.filled)
                    prompts.append((s, s.filled, n))
                    room -= n
            if apart and prompts:
                decodes = []
            if not decodes and not prompts:
                t = pending[0].arrival_s
                continue
            t += cost.seconds(Batch(tuple((a, n, a + n == len(s.request.prompt)) for s, a, n in prompts),
                                    tuple(len(s.request.prompt) + len(s.token_times) for s in decodes)))
            for s, a, n in prompts:
                s.filled += n
                if s.filled == len(s.request.prompt):
                    s.token_times.append(t)
            for s in decodes:
                s.token_times.append(t)
            for s in [s for s in live if len(s.token_times) >= s.request.n_gen]:
                live.remove(s)
                done.append(s)
        return Run(0.0, t, done)

    return serve


def test_the_probes_recover_a_stepping_engines_own_step_costs():
    """Every probe reads the step it was made for: the fit on them finds the calibration that priced the engine,
    and the held-out shape, never fitted, is priced as the engine ran it."""
    model, nominal = specs()
    truth = CostModel(model, nominal.with_calibration(TRUTH))
    plan = server_probes.plan()
    measured = server_probes.measure(stepping_engine(truth, plan.budget), plan, model.vocab)
    cal = server_probes.fit_probes(measured, model, nominal, plan)
    for key, value in TRUTH.items():
        assert cal["fitted"][key] == pytest.approx(value, rel=0.02, abs=2e-4), key
    kinds = {r["probe"] for r in cal["steps"]}
    assert kinds == {"lone prompt: TTFT", "decodes: the gap between tokens", "prompt beside decodes: the decoders' gap"}
    assert len(cal["steps"]) == len(plan.prompts) + len(plan.decodes) + len(plan.chunks)
    assert max(abs(r["error"]) for r in cal["steps"]) < 0.01
    held = [r for r in cal["steps"] if r["held_out"]]
    assert [r["point"] for r in held] == [plan.held_out().label] and "+ 7 decodes" in held[0]["point"]
    assert cal["held_out_abs_error"] < 0.01
    # each measured time is what the engine's step cost: a lone prompt's TTFT is its one step
    lone = next(r for r in cal["steps"] if r["point"] == "chunk 128@0")
    assert lone["measured_ms"] == pytest.approx(1e3 * truth.seconds(Batch(((0, 128, True),))), rel=1e-9)
    assert cal["fitted"]["step_jitter"] < 0.01  # no noise in this engine: the decodes' growing context is no spread
    sim = SimBackend(*calibration_specs(cal), calibration=cal)
    assert sim.cost.seconds(Batch((), (300,) * 4)) == pytest.approx(truth.seconds(Batch((), (300,) * 4)), rel=0.01)


def test_the_probes_fit_the_measured_pricings_terms_too():
    """An engine whose steps cost what measured curves and a host line say: the probes' measured-form fit prices
    the held-out shape as the engine ran it, and the sim runs --sim-pricing measured on the file."""
    from prefillbench.backends.sim import calibration_measured

    model, nominal = specs()
    truth_fit = {"gemm_compute_eff": 0.5, "gemm_memory_eff": 0.6, "gemm_sharpness": 4.0, "gemm_floor_s": 2e-6,
                 "elementwise_memory_eff": 0.5, "elementwise_floor_s": 2e-6, "prefill_attention_eff": 0.3,
                 "decode_attention_eff": 0.3, "cpu_base_s": 3e-4, "cpu_per_seq_s": 1e-5}
    truth = calibration_measured.cost_model(model, nominal, truth_fit)
    plan = server_probes.plan()
    measured = server_probes.measure(stepping_engine(truth, plan.budget), plan, model.vocab)
    cal = server_probes.fit_probes(measured, model, nominal, plan)
    part = cal["measured"]
    assert set(part["fitted"]) == set(calibration_measured.PARAMS)
    assert part["median_abs_error"] < 0.01 and part["held_out_abs_error"] < 0.01
    sim = SimBackend(*calibration_specs(cal), calibration=cal, pricing="measured")
    assert sim.cost.seconds(Batch((), (300,) * 4)) == pytest.approx(truth.seconds(Batch((), (300,) * 4)), rel=0.01)


def test_a_plan_holds_every_probe_in_one_launch():
    plan = server_probes.plan(quick=True, prompt=256, n_gen=32, budgets=(32, 64, 128, 256))
    assert plan.slots == 8 and plan.beside == 7
    assert plan.budget >= max(plan.prompts) and plan.budget >= max(plan.chunks) + plan.beside  # a lone prompt is one step
    assert plan.slot_length % 256 == 0 and plan.slot_length > max(L for _, L in plan.decodes) + plan.decode_tokens
    assert 272 in {L for _, L in plan.decodes} and {32, 64, 128, 256} <= set(plan.chunks)  # the workload's shapes
    assert plan.held_out() == Point((0, 256), 7, 128)
    # without two mixed shapes the middle decode batch is held out
    assert replace(plan, chunks=()).held_out().chunk is None


def test_a_prompt_the_engine_runs_apart_from_the_decodes_gives_no_mixed_sample():
    """An engine whose prefill pauses the decodes runs no chunk beside them: the decoders' next token comes a step
    after the prompt's, and the probe says so rather than pricing a step that never ran."""
    model, nominal = specs()
    truth = CostModel(model, nominal.with_calibration(TRUTH))
    plan = server_probes.plan(quick=True, repeats=1)
    measured = server_probes.measure(stepping_engine(truth, plan.budget, apart=True), plan, model.vocab)
    assert not [s for s in measured.fit if s.point.chunk and s.point.n_decodes]
    cal = server_probes.fit_probes(measured, model, nominal, plan)
    assert cal["held_out_abs_error"] is None


def test_a_server_with_fewer_slots_than_a_probe_skips_that_probe_and_says_why():
    """At --url the server's slots are its own: a batch it cannot run whole has no step of that many decodes to
    read, and is skipped (named in the file) rather than priced wrong or ending the calibration."""
    model, nominal = specs()
    truth = CostModel(model, nominal.with_calibration(TRUTH))
    plan = server_probes.plan(quick=True, repeats=1)
    measured = server_probes.measure(stepping_engine(truth, plan.budget, slots=4), plan, model.vocab)
    cal = server_probes.fit_probes(measured, model, nominal, plan)
    assert [w.split(":")[0] for w in cal["probes"]["skipped"]] == ["8 decoding at 64", "8 decoding at 256"]
    assert {r["point"] for r in cal["steps"]} >= {"4 decodes@256", "1 decodes@64"}
    assert not any(r["point"].startswith("8 decodes") for r in cal["steps"])


def test_decode_steps_read_through_events_that_carry_several_tokens():
    """vLLM's stream may put two tokens in one event (the client gives both its arrival): the step is then the
    window's mean, not a median the zero gaps pull down."""
    times = [0.0, 0.1, 0.2, 0.2, 0.4, 0.4, 0.6, 0.7]  # 7 steps of 0.1 s, two of them merged
    s = Streamed(Request((1,) * 8, 8), 0.0, times)
    step, gaps = server_probes.decode_step([s], 8)
    assert step == pytest.approx(0.1)
    assert [k for _, k in gaps[0]] == list(range(9, 16))  # each gap's context: the prompt and the tokens so far


# ---- through HTTP: the stub server's known pace ------------------------------------------------------------------
@pytest.fixture
def no_stub_left():
    yield
    for _ in range(50):
        if not session_processes(lambda args: "prefillbench.backends.server.stub" in args):
            return
        time.sleep(0.1)
    assert False, "a stub server outlived the calibration"


#: The stub's known costs: every token 20 ms apart, whatever runs beside it; a prompt 1 ms a token.
TOKEN_MS, PROMPT_MS = 20.0, 1.0
#: What the client's clock adds to a probe on a loaded 2-core machine: the stub's asyncio sleep wakes late by up to
#: a millisecond or so, and a request crosses localhost HTTP twice (its way in, its first token's way out).
RESOLUTION_MS = 3.0


def test_the_probes_recover_the_stub_servers_known_pace(no_stub_left):
    """The stub is no stepping engine (each request is paced on its own), so its prompts never share a step with the
    decodes: the mixed probe is left out here. Its lone prompts and decode batches are the costs it was given."""
    from prefillbench.backends import load_backend
    from prefillbench.commands.calibrate import probe_server

    real = load_backend("server", None, engine="llama-server",
                        server_cmd=f"{STUB} --token-ms {TOKEN_MS:g} --prompt-ms-per-token {PROMPT_MS:g}")
    plan = replace(server_probes.plan(quick=True, repeats=2), chunks=())
    try:
        cal = probe_server(real, plan, None, None, None)
    finally:
        real.close()
    model, gpu = calibration_specs(cal)
    cost = CostModel(model, gpu)
    # the roofline's own misfit, beside the timing: it prices a prompt's attention (its n^2 term), which the stub has not
    attention = lambda n: cost.step_cost(Batch(((0, n, True),))).breakdown()["prefill_attention"]["seconds"] * 1e3  # noqa: E731
    for n in plan.prompts:
        fitted = 1e3 * cost.seconds(Batch(((0, n, True),)))
        assert abs(fitted - n * PROMPT_MS) <= 2 * RESOLUTION_MS + attention(n) + 0.03 * n * PROMPT_MS, n
    for c, L in plan.decodes:
        fitted = 1e3 * cost.seconds(Batch((), (L + plan.decode_tokens // 2,) * c))
        assert abs(fitted - TOKEN_MS) <= RESOLUTION_MS + 0.05 * TOKEN_MS, (c, L)
    rows = {r["point"]: r for r in cal["steps"]}
    assert rows["chunk 128@0"]["measured_ms"] == pytest.approx(128 * PROMPT_MS, abs=2 * RESOLUTION_MS)
    assert cal["probes"]["budget"] == plan.budget and cal["probes"]["slots"] == 8
    assert f"-b {plan.budget}" in cal["probes"]["server_command"]  # launched with the budget that holds every probe


def test_calibrate_on_a_server_writes_a_file_the_sim_loads_with_its_residuals(run_cli, tmp_path, no_stub_left):
    out, errors = tmp_path / "cal.json", tmp_path / "errors.csv"
    code, stdout, err = run_cli("calibrate", "--backend", "server", "--engine", "llama-server", "--server-cmd",
                                f"{STUB} --token-ms 10 --prompt-ms-per-token 0.5", "--quick", "--repeats", "1",
                                "--export", str(out), "--errors", str(errors))
    assert code == 0, err
    cal = load_calibration(out)
    SimBackend(*calibration_specs(cal), calibration=cal)
    assert cal["backend"] == "llama-server" and cal["probes"]["engine"] == "llama-server"
    for kind in ("lone prompt: TTFT", "decodes: the gap between tokens"):
        assert kind in stdout
    assert "fit error over" in stdout and "held-out check (chunk 256@0 + 7 decodes@128" in stdout
    assert "probes whose steps are known" in err
    header = errors.read_text().splitlines()[0]
    assert header == "point,probe,held_out,measured_ms,predicted_ms,error"
    code, stdout, err = run_cli("run", "--backend", "sim", "--calibration", str(out), "-p", "64", "-n", "4", "-c", "2",
                                "-r", "1", "-s", "sarathi-serve", "--no-progress", "--no-results-file")
    assert code == 0, err


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--backend", "gguf", "--url", "http://127.0.0.1:9"], "--url is for a serving engine"),
    (["calibrate", "--backend", "server", "--engine", "llama-server", "--server-cmd", f"{STUB}", "--check"],
     "--check steps the backend"),
    (["tune", "--backend", "server", "--engine", "vllm", "--quick", "--calibrate-on", "gguf"],
     "--calibrate-on gguf steps llama.cpp on the gguf backend: only for llama-server"),
    (["tune", "--backend", "llama-server", "--url", "http://127.0.0.1:9", "--quick", "--calibrate-on", "gguf"],
     "not llama-server at --url"),
    (["tune", "--backend", "llama-server", "--quick", "--calibrate-on", "server", "--calibration", "x.json"],
     "--calibration FILE is its calibration"),
    (["tune", "--backend", "llama-server", "--quick", "--calibrate-on", "server", "--no-sim"], "--no-sim has none"),
    (["tune", "--backend", "llama-server", "--quick", "--calibrate-on", "steps"], "--calibrate-on steps: choose server or gguf"),
    (["tune", "--backend", "sim", "--sim-model", "mistral-7b", "--pg", "256,8", "--slo", "tbt=100", "--calibrate-on", "server"],
     "--calibrate-on is for a server's sim"),
])
def test_bad_combinations_are_refused_in_one_line(run_cli, argv, message, no_stub_left):
    code, out, err = run_cli(*argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err


def test_tune_on_a_server_calibrates_the_sim_on_the_server_itself(run_cli, tmp_path, no_stub_left, monkeypatch):
    """No proxy: tune's sim is fitted on the server's own probes (the gguf backend is never loaded)."""
    import prefillbench.commands.tune as tune_command

    def no_gguf(*args, **kwargs):
        raise AssertionError("the gguf proxy was loaded")

    monkeypatch.setattr(tune_command, "load_backend", no_gguf)
    export = tmp_path / "t.json"
    code, out, err = run_cli("tune", "--backend", "server", "--engine", "llama-server", "--server-cmd",
                             f"{STUB} --token-ms 10 --prompt-ms-per-token 0.5", "--quick", "--sim-only",
                             "--chunk-size", "64", "--no-progress", "--export", str(export))
    assert code == 0, err
    assert "calibrating the sim on llama-server with probes whose steps are known" in err
    assert "the sim's fit on llama-server's probes: median error" in err
    assert {c["stage"] for c in json.loads(export.read_text())["configurations"]} >= {"sim"}


# ---- the real llama-server -------------------------------------------------------------------------------------
def test_calibrate_on_llama_server_end_to_end(run_cli, tmp_path):
    """`make server`'s llama-server, the shipped model: every probe runs, the fit's residuals are printed, the file
    prices the sim, and no server is left. -t 1 and one repeat keep it short (a shared 2-core machine's timings are
    noise here: the test asserts the path, not the error)."""
    out = tmp_path / "cal.json"
    code, stdout, err = run_cli("calibrate", "--backend", "llama-server", "-t", "1", "--quick", "--repeats", "1",
                                "--export", str(out))
    assert code == 0, err
    cal = load_calibration(out)
    sim = SimBackend(*calibration_specs(cal), calibration=cal)
    assert sim.cost.seconds(Batch((), (300,) * 4)) > 0
    assert {r["probe"] for r in cal["steps"]} >= {"lone prompt: TTFT", "decodes: the gap between tokens"}
    assert all(r["measured_ms"] > 0 for r in cal["steps"]) and cal["probes"]["failed_requests"] == 0
    assert "--poll 0" in cal["probes"]["server_command"] and f"-b {cal['probes']['budget']}" in cal["probes"]["server_command"]
    assert stdout.count("lone prompt: TTFT") == 3 and "fit error over" in stdout and "held-out check" in stdout
    assert not session_processes(lambda args: args.split(" ")[0].endswith("llama-server"))


def test_tune_calibrate_on_gguf_keeps_the_proxy_reachable(run_cli, tmp_path, no_stub_left, monkeypatch):
    """--calibrate-on gguf: llama-server's sim calibrated as before, on a backend that steps llama.cpp (a fake
    stands in for the gguf backend here, its virtual clock keeping the sweep short); the server is not probed."""
    import prefillbench.commands.tune as tune_command
    from prefillbench.backends import load_backend

    loaded = []

    def stepped(name, model, **options):
        loaded.append(name)
        return load_backend("fake", None)

    monkeypatch.setattr(tune_command, "load_backend", stepped)
    code, out, err = run_cli("tune", "--backend", "server", "--engine", "llama-server", "--server-cmd",
                             f"{STUB} --token-ms 10", "--quick", "--sim-only", "--chunk-size", "64",
                             "--sim-model", "mistral-7b", "--calibrate-on", "gguf", "--no-progress")
    assert code == 0, err
    assert loaded == ["gguf"]
    assert "probes whose steps are known" not in err and "calibrating the sim on fake" in err


def test_calibrate_at_a_url_probes_the_server_as_it_runs(run_cli, tmp_path):
    """A server prefillbench did not launch: its configuration stands (a line says what the probes assume of it),
    the model's shapes come from --sim-model, and without them the command says so in one line."""
    import subprocess
    import urllib.request

    from prefillbench.backends.server.process import free_port

    port = free_port()
    stub = subprocess.Popen([*STUB.format(port=port).split(), "--token-ms", "10", "--prompt-ms-per-token", "0.5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        url = ["calibrate", "--backend", "server", "--url", f"http://127.0.0.1:{port}", "--quick", "--repeats", "1"]
        code, out, err = run_cli(*url, "--export", str(tmp_path / "c.json"))
        assert code == 2 and len(err.strip().splitlines()) == 1 and "give --sim-model" in err
        code, out, err = run_cli(*url, "--sim-model", default_model_path(), "--export", str(tmp_path / "c.json"))
        assert code == 0, err
        assert f"the server at http://127.0.0.1:{port} runs its own configuration" in err
        cal = load_calibration(tmp_path / "c.json")
        assert cal["probes"]["strategy"] == "as served" and cal["probes"]["budget"] is None
        assert f"--backend server --engine llama-server --url http://127.0.0.1:{port}" in out
    finally:
        stub.terminate()
        stub.wait(10)
