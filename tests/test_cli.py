"""The command line, end to end on a tiny checkpoint folder."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from prefillbench import cli
from prefillbench.commands import run as run_command
from prefillbench.backends.base import BackendError
from prefillbench.bench.metrics import ResultRow


TORCH = ["run", "--backend", "torch", "--no-progress"]
BASE = ["-p", "16", "-n", "4", "--pg", "12,3", "-c", "1,2", "-r", "2", "--chunk-size", "5"]
THREE = ["-s", "sequential,padded,chunked"]


def test_markdown_table_has_a_row_per_case(tiny_folder, run_cli, tmp_path):
    code, out, err = run_cli(*TORCH, "-m", tiny_folder, *BASE, *THREE, "--results-dir", str(tmp_path))
    assert code == 0, err
    table, _, verdict = out.partition("\n\nVerdict against sequential")
    assert verdict, "a table comparing strategies ends in its verdict"
    lines = table.strip().splitlines()
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    assert header == ["model", "backend", "strategy", "test", "t/s", "ms/t", "concurrency", "throughput/s",
                      "TTFT p50/p99 ms", "TBT p50/p99 ms", "TBT p99 behind prefill ms (prompt t)", "CV"]
    rows = lines[2:]
    assert len(rows) == 3 * 3 * 2  # tests × strategies × concurrency
    assert {r.split("|")[4].strip() for r in rows} == {"pp16", "tg4", "pp12+tg3"}
    assert all("±" in r.split("|")[5] for r in rows)
    # A pp request has one token: no time between tokens, shown as "-", not "nan".
    pp_rows = [r.split("|") for r in rows if r.split("|")[4].strip() == "pp16"]
    assert pp_rows and all(cells[10].strip() == "-/-" for cells in pp_rows)
    assert "nan" not in out
    # Every run also leaves results/<timestamp>.csv behind.
    (written,) = tmp_path.glob("*.csv")
    assert len(list(csv.DictReader(written.open()))) == 18


def test_csv_on_stdout_and_json_export_carry_every_field(tiny_folder, run_cli, tmp_path):
    export = tmp_path / "out.json"
    code, out, err = run_cli(*TORCH, "-m", tiny_folder, *BASE, "-s", "chunked", "-o", "csv", "--export", str(export),
                             "--no-results-file")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 6
    assert list(rows[0])[: len(ResultRow.columns())] == ResultRow.columns()
    for row in rows:
        assert float(row["ts_mean"]) > 0 and float(row["throughput"]) > 0
        assert float(row["ms_per_token"]) == pytest.approx(1000 / float(row["ts_mean"]), rel=1e-6)
        assert row["chunk_size"] == "5" and row["repetitions"] == "2"
    data = json.loads(export.read_text())
    meta = data["metadata"]
    for key in ("timestamp", "cpu", "torch_version", "transformers_version", "dtype", "threads", "weights"):
        assert meta.get(key) not in (None, ""), key
    assert len(data["results"]) == 6


def test_verify_reports_agreement_per_strategy(tiny_folder, run_cli):
    from strategies import STRATEGIES, make_strategy

    unpriced = [n for n, c in STRATEGIES.items() if not c.needs_price]  # a run with no --slo leaves slo-budget out
    # --token-budget is --chunk-size under the name sarathi-serve's paper gives it.
    code, out, err = run_cli(*TORCH, "-m", tiny_folder, "-p", "0", "-n", "0", "--pg", "12,3", "-c", "2", "--token-budget", "5",
                             "-r", "1", "--verify", "--no-results-file")
    assert code == 0, err
    rows = [line for line in err.splitlines() if line.startswith("| pp12+tg3")]
    assert [r.split("|")[3].strip() for r in rows] == [
        f"{s} (5)" if make_strategy(s).uses_chunk_size else s for s in unpriced[1:]]
    assert all(r.split("|")[4].strip() == "sequential" and r.rstrip(" |").endswith("ok") for r in rows)
    assert f"verify: all {len(unpriced) - 1} comparisons agree within tolerance" in err
    assert "sarathi-serve (5)" in out


def test_verify_fails_a_corrupted_strategy(tiny_folder, run_cli, monkeypatch):
    from strategies.padded import Padded

    original = Padded.next_step

    def corrupt(self, waiting, running):
        step = original(self, waiting, running)
        # Feed a wrong token to every decode: the logits that follow change.
        from dataclasses import replace
        return replace(step, decodes=tuple(d._replace(token=(d.token + 1) % 512) for d in step.decodes))

    monkeypatch.setattr(Padded, "next_step", corrupt)
    code, out, err = run_cli(*TORCH, "-m", tiny_folder, "-p", "0", "-n", "6", "-c", "2", "-r", "1", "-s", "sequential,padded,packed",
                             "--verify", "--no-results-file")
    assert code == 1
    verdicts = {line.split("|")[3].strip(): line.split("|")[-2].strip() for line in err.splitlines() if line.startswith("| tg6")}
    assert verdicts == {"padded": "FAIL", "packed": "ok"}
    assert "verify: 1 of 2 comparisons disagree beyond tolerance" in err


def test_verify_needs_logits(capsys):
    code = cli.main(["run", "--backend", "sim", "-p", "64", "-n", "0", "-c", "1", "--verify", "--no-results-file", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1] == "prefillbench: error: --verify compares logits, and the sim backend computes none"


def test_interrupt_keeps_measured_rows(tiny_folder, run_cli, monkeypatch, tmp_path):
    calls = {"n": 0}
    real = run_command.run_case

    def interrupt_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_command, "run_case", interrupt_on_third)
    export = tmp_path / "partial.csv"
    code, out, err = run_cli(*TORCH, "-m", tiny_folder, *BASE, *THREE, "--export", str(export), "--no-results-file")
    assert code == 130
    assert "kept 2 measured row(s)" in err
    assert len(out.strip().splitlines()) == 2 + 2
    assert len(list(csv.DictReader(export.open()))) == 2


def test_a_failing_step_keeps_measured_rows(tiny_folder, run_cli, monkeypatch, tmp_path):
    from prefillbench.backends.base import BackendError
    from prefillbench.backends.torch.backend import TorchBackend

    real = TorchBackend.execute
    calls = {"n": 0}

    def fail_late(self, step, return_logits=False):
        calls["n"] += 1
        if calls["n"] > 60:
            raise BackendError("out of KV space")
        return real(self, step, return_logits)

    monkeypatch.setattr(TorchBackend, "execute", fail_late)
    export = tmp_path / "partial.csv"
    code, out, err = run_cli(*TORCH, "-m", tiny_folder, *BASE, *THREE, "--export", str(export), "--no-results-file")
    assert code == 2
    assert "failed: out of KV space" in err and "step" in err and "kept" in err and "Traceback" not in err
    kept = list(csv.DictReader(export.open()))
    assert 0 < len(kept) < 18


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-m", "/nonexistent/model.gguf"], "model file not found"),
        (["-c", "0"], "concurrency must be at least 1"),
        (["--chunk-size", "0"], "chunk size must be at least 1"),
        (["-s", "fifo"], "unknown strategy 'fifo'"),
        (["-p", "300", "-n", "0"], "context is 256"),
        (["--export", "out.xlsx"], "cannot tell the format of out.xlsx"),
        (["-p", "0", "-n", "0"], "no test to run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_folder, run_cli, argv, message):
    args = argv if "-m" in argv else ["-m", tiny_folder, *argv]
    code, out, err = run_cli(*TORCH, *args, "--no-results-file")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("prefillbench: error:")
    assert message in err and "Traceback" not in err


def test_unreadable_gguf_and_unsupported_architecture(run_cli, tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("not a gguf file")
    code, _, err = run_cli(*TORCH, "-m", str(bogus))
    assert code == 2 and "cannot load" in err and "Traceback" not in err

    from transformers import T5Config

    folder = tmp_path / "t5"
    folder.mkdir()
    T5Config(d_model=32, num_layers=1, num_heads=2, d_kv=16, d_ff=32, vocab_size=128).save_pretrained(folder)
    code, _, err = run_cli(*TORCH, "-m", str(folder))
    assert code == 2 and "cannot load" in err


def test_cuda_without_cuda_is_refused(tiny_folder, run_cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run_cli(*TORCH, "-m", tiny_folder, "--device", "cuda")
    assert code == 2 and "--device cuda" in err


def test_console_entry_point_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "prefillbench", "run", "--backend", "torch", "-m", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("prefillbench: error:")


# ---- the Typer command line: flags, help, usage errors (on the sim backend: fast, no model) ----

SIM = ["run", "--backend", "sim", "--no-progress", "--no-results-file", "--no-warmup", "-r", "1", "-s", "chunked"]


def test_comma_lists_and_repeated_flags_combine(capsys):
    assert cli.main([*SIM, "-p", "16,32", "-p", "64", "-n", "0", "-c", "1", "-c", "2", "-o", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert sorted({(r["test"], r["concurrency"]) for r in rows}) == sorted(
        (f"pp{p}", str(c)) for p in (16, 32, 64) for c in (1, 2))


def test_llama_bench_short_forms_parse(monkeypatch):
    seen = {}
    monkeypatch.setattr(run_command, "cmd_run", lambda options: seen.update(vars(options), **vars(options.load)) or 0)
    argv = ["run", "-m", "x.gguf", "-p", "8", "-n", "2", "-c", "1,4", "-r", "5", "-s", "padded", "-t", "3", "-ngl", "99",
            "-o", "json", "--pg", "16,4", "--pg", "8,2", "--chunk-size", "32,64", "--noisy-cv", "5%"]
    assert cli.main(argv) == 0
    assert seen["model"] == "x.gguf" and seen["n_prompt"] == [8] and seen["n_gen"] == [2]
    assert seen["concurrency"] == [1, 4] and seen["repetitions"] == 5 and seen["strategy"] == ["padded"]
    assert seen["threads"] == 3 and seen["n_gpu_layers"] == 99 and seen["output"] == "json"
    assert seen["pg"] == [(16, 4), (8, 2)] and seen["chunk_size"] == [32, 64] and seen["noisy_cv"] == 5.0
    assert not seen["no_warmup"] and not seen["no_results_file"] and not seen["no_progress"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--no-such-flag"], "No such option: --no-such-flag"),
        (["run", "-p", "x"], "'-p' / '--n-prompt'"),
        (["run", "-c", ","], "'-c' / '--concurrency'"),
        (["run", "-s", ","], "'-s' / '--strategy'"),
        (["run", "--pg", "5"], "expected PP,TG"),
        (["run", "-o", "xml"], "'-o' / '--output'"),
        (["run", "--backend", "tpu"], "'--backend'"),
        (["run", "--noisy-cv", "-1"], "a percentage of at least 0"),
        (["run", "-p", "-5"], "a length cannot be negative, got -5"),
        (["run", "-n", "4,-1"], "a length cannot be negative, got -1"),
        (["run", "-r"], "requires an argument"),
        (["compare", "a.csv"], "Missing argument 'CURRENT'"),
        (["compare", "a.csv", "b.csv", "--metric", "speed"], "unknown metric 'speed'"),
        (["plot"], "Missing argument"),
        (["calibrate", "--check-run", "1,2"], "five positive integers"),
        (["nosuchcommand"], "No such command"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(capsys, argv, message):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("prefillbench: error:") and message in err, err
    assert "Traceback" not in err and "╭" not in err


def test_version_help_and_completion_options(capsys):
    from prefillbench import __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"prefillbench {__version__}"
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for panel in ("model and backend", "tests", "output", "sim backend"):
        assert panel in out
    assert "-ngl" in out and "--n-prompt" in out
    assert cli.main(["--help"]) == 0
    assert "--install-completion" in capsys.readouterr().out
    assert cli.main([]) == 2  # no command: the help, on stderr


def test_unwritable_export_is_refused_before_the_first_case(capsys, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("a case ran")

    monkeypatch.setattr(run_command, "run_case", must_not_run)
    for flag in (["--export", "/proc/nope/out.csv"], ["--export-requests", "/proc/nope/r.jsonl"]):
        assert cli.main([*SIM, "-p", "16", "-n", "0", "-c", "1", *flag]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot create the folder /proc/nope" in err
    argv = [a for a in SIM if a != "--no-results-file"]
    assert cli.main([*argv, "-p", "16", "-n", "0", "-c", "1", "--results-dir", "/proc/nope"]) == 2
    assert "cannot create the folder /proc/nope" in capsys.readouterr().err


def test_a_failed_write_still_prints_the_rows(capsys, monkeypatch, tmp_path):
    from prefillbench.report import tables

    def disk_full(path, rows, meta):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(tables, "export", disk_full)
    assert cli.main([*SIM, "-p", "16", "-n", "0", "-c", "1,2", "--export", str(tmp_path / "out.csv")]) == 2
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 2 + 2  # the md table: header, rule, two rows
    assert err.strip().splitlines()[-1].startswith("prefillbench: error: cannot write")
    assert "No space left on device" in err and "Traceback" not in err


def test_exported_files_get_the_umask_permissions(capsys, tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        assert cli.main([*SIM, "-p", "16", "-n", "0", "-c", "1", "--export", str(tmp_path / "out.json")]) == 0
    finally:
        os.umask(old)
    for name in ("out.json", "out.requests.jsonl"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_concurrency_above_the_backend_limit_is_refused_before_loading(capsys, use_backend):
    from prefillbench.backends.gguf import GGUFBackend

    def must_not_load(*args, **kwargs):
        raise AssertionError("the backend was loaded")

    use_backend(must_not_load)
    limit = GGUFBackend.sequence_limit
    assert cli.main(["run", "--backend", "gguf", "-c", f"1,{limit + 1}", "--no-results-file"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"-c {limit + 1}: the gguf backend runs at most {limit} sequences" in err


def test_a_hub_id_without_network_fails_fast_in_one_line(run_cli, monkeypatch):
    import time

    from prefillbench import models

    monkeypatch.setattr(models, "hub_reachable", lambda timeout=models.HUB_PROBE_TIMEOUT_S: False)
    t0 = time.perf_counter()
    code, _, err = run_cli(*TORCH, "-m", "nobody-here/no-such-model-xyz", "-p", "8", "-n", "0", "--no-results-file")
    assert code == 2 and err.strip().splitlines()[-1].startswith("prefillbench: error: nobody-here/no-such-model-xyz")
    assert "hub cannot be reached" in err and "Traceback" not in err and "retry" not in err.lower()
    assert time.perf_counter() - t0 < 30  # transformers' own retries take ~40 s


def test_a_cached_hub_model_loads_offline_when_the_hub_is_out_of_reach(monkeypatch):
    import huggingface_hub

    from prefillbench import models

    monkeypatch.setattr(models, "hub_reachable", lambda timeout=models.HUB_PROBE_TIMEOUT_S: False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: f"/cache/{repo}/{name}")
    assert models.hub_load_options("org/cached-model") == {"local_files_only": True}
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=models.HUB_PROBE_TIMEOUT_S: True)
    assert models.hub_load_options("org/cached-model") == {}


@pytest.mark.parametrize("argv", [
    ["run", "--backend", "torch", "-p", "8", "-n", "0", "-c", "1", "--no-progress", "--no-results-file"],
    ["capacity", "--backend", "torch", "--pg", "8,2", "--slo", "tbt=100", "--no-progress"],
], ids=["run", "capacity"])
def test_backend_switches_reach_the_backend(argv, use_backend, capsys):
    seen = {}

    def fake_load(name, model, **kwargs):
        seen.clear()
        seen.update(kwargs)
        raise BackendError("stop here")

    use_backend(fake_load)
    assert cli.main(argv) == 2
    assert "cuda_graphs" not in seen and "tune_linear" not in seen and "flash_attn" not in seen
    assert cli.main([*argv, "--no-cuda-graphs", "--no-tune-linear", "-fa", "off"]) == 2
    assert seen["cuda_graphs"] is False and seen["tune_linear"] is False and seen["flash_attn"] == "off"
    assert "kernels" not in seen
    assert cli.main([*argv, "--kernels", "torch"]) == 2
    assert seen["kernels"] == "torch"


def test_tune_linear_setting_is_recorded_in_the_export(tiny_folder, run_cli, tmp_path):
    for flag, expected in (("--no-tune-linear", "off"), (None, "on")):
        export = tmp_path / f"run-{expected}.json"
        code, _, err = run_cli(*TORCH, "-m", tiny_folder, "-p", "8", "-n", "0", "-c", "1", "-s", "sequential", "-r", "1",
                               "--no-results-file", "--export", str(export), *([flag] if flag else []))
        assert code == 0, err
        assert json.loads(export.read_text())["metadata"]["tune_linear"] == expected
