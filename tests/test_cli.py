"""The command line, end to end on a tiny checkpoint folder."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from prefillbench import cli
from prefillbench.metrics import ResultRow
from tiny_models import tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    model, _ = tiny_model("llama")
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    return str(folder)


def run_cli(capsys, *argv):
    code = cli.main(["run", "--backend", "torch", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["-p", "16", "-n", "4", "--pg", "12,3", "-c", "1,2", "-r", "2", "--chunk-size", "5"]


def test_markdown_table_has_a_row_per_case(tiny_folder, capsys, tmp_path):
    code, out, err = run_cli(capsys, "-m", tiny_folder, *BASE, "--results-dir", str(tmp_path))
    assert code == 0, err
    lines = out.strip().splitlines()
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    assert header == ["model", "backend", "strategy", "test", "t/s", "ms/t", "concurrency", "throughput/s",
                      "TTFT p50/p99 ms", "TBT p50/p99 ms", "CV"]
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


def test_csv_on_stdout_and_json_export_carry_every_field(tiny_folder, capsys, tmp_path):
    export = tmp_path / "out.json"
    code, out, err = run_cli(capsys, "-m", tiny_folder, *BASE, "-s", "chunked", "-o", "csv", "--export", str(export),
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


def test_verify_reports_agreement(tiny_folder, capsys):
    code, out, err = run_cli(capsys, "-m", tiny_folder, *BASE, "-r", "1", "--verify", "--no-results-file")
    assert code == 0
    assert "all strategies produced the same greedy tokens" in err


def test_verify_reports_a_mismatch(tiny_folder, capsys, monkeypatch):
    from strategies.padded import Padded

    original = Padded.next_step

    def corrupt(self, waiting, running):
        step = original(self, waiting, running)
        # Feed a wrong token to every decode: the greedy continuation changes.
        from dataclasses import replace
        return replace(step, decodes=tuple(replace(d, token=(d.token + 1) % 512) for d in step.decodes))

    monkeypatch.setattr(Padded, "next_step", corrupt)
    code, out, err = run_cli(capsys, "-m", tiny_folder, "-p", "0", "-n", "6", "-c", "2", "-r", "1", "--verify", "--no-results-file")
    assert code == 1
    assert "verify: tg6 c=2 request 0: padded differs from sequential" in err


def test_interrupt_keeps_measured_rows(tiny_folder, capsys, monkeypatch, tmp_path):
    calls = {"n": 0}
    real = cli.run_case

    def interrupt_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "run_case", interrupt_on_third)
    export = tmp_path / "partial.csv"
    code, out, err = run_cli(capsys, "-m", tiny_folder, *BASE, "--export", str(export), "--no-results-file")
    assert code == 130
    assert "kept 2 measured row(s)" in err
    assert len(out.strip().splitlines()) == 2 + 2
    assert len(list(csv.DictReader(export.open()))) == 2


def test_a_failing_step_keeps_measured_rows(tiny_folder, capsys, monkeypatch, tmp_path):
    from prefillbench.backends.base import BackendError
    from prefillbench.backends.torch_backend import TorchBackend

    real = TorchBackend.execute
    calls = {"n": 0}

    def fail_late(self, step, return_logits=False):
        calls["n"] += 1
        if calls["n"] > 60:
            raise BackendError("out of KV space")
        return real(self, step, return_logits)

    monkeypatch.setattr(TorchBackend, "execute", fail_late)
    export = tmp_path / "partial.csv"
    code, out, err = run_cli(capsys, "-m", tiny_folder, *BASE, "--export", str(export), "--no-results-file")
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
        (["--export", "out.xlsx"], "cannot tell the export format"),
        (["-p", "0", "-n", "0"], "no test to run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_folder, capsys, argv, message):
    args = argv if "-m" in argv else ["-m", tiny_folder, *argv]
    code, out, err = run_cli(capsys, *args, "--no-results-file")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("prefillbench: error:")
    assert message in err and "Traceback" not in err


def test_unreadable_gguf_and_unsupported_architecture(capsys, tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("not a gguf file")
    code, _, err = run_cli(capsys, "-m", str(bogus))
    assert code == 2 and "cannot load" in err and "Traceback" not in err

    from transformers import T5Config

    folder = tmp_path / "t5"
    folder.mkdir()
    T5Config(d_model=32, num_layers=1, num_heads=2, d_kv=16, d_ff=32, vocab_size=128).save_pretrained(folder)
    code, _, err = run_cli(capsys, "-m", str(folder))
    assert code == 2 and "cannot load" in err


def test_cuda_without_cuda_is_refused(tiny_folder, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code, _, err = run_cli(capsys, "-m", tiny_folder, "--device", "cuda")
    assert code == 2 and "--device cuda" in err


def test_console_entry_point_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "prefillbench", "run", "--backend", "torch", "-m", str(tmp_path / "missing")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("prefillbench: error:")
