"""Options as one validated value per command: flags a backend ignores are named, inputs are not quietly
reinterpreted, and the help and the messages say what they mean (issue 28's items 4, 5 and 10)."""
from __future__ import annotations

import csv
import inspect
import io
import re

import pytest

from strategies import STRATEGIES

from prefillbench import cli
from prefillbench.backends import BACKENDS, HIDDEN_BACKENDS, backend_class, check_options, load_backend
from prefillbench.backends.base import BackendError

SIM = ["run", "--backend", "sim", "--no-progress", "--no-results-file", "--no-warmup", "-s", "chunked", "-p", "16", "-n", "0"]


def stop_at_load(name, model, **options):
    raise BackendError("stop here")


# ---------------------------------------------------------------- 28.4: no flag silently ignored


def test_every_declared_option_is_a_keyword_its_backend_takes():
    for name, entry in ((n, e) for n, e in BACKENDS.items() if n not in HIDDEN_BACKENDS):  # the fake takes none
        cls = entry.load_class()
        taken = set(inspect.signature(cls.load).parameters)
        if "options" in taken:  # torch hands the rest on to __init__
            taken |= set(inspect.signature(cls.__init__).parameters)
        assert cls.options and cls.options <= taken, (name, cls.options - taken)


def test_load_backend_drops_what_the_backend_does_not_take_and_check_options_names_it():
    assert check_options("sim", {"dtype": "bfloat16", "threads": 3, "sim_gpu": "a100"}) == {"threads": ""}
    backend = load_backend("sim", None, dtype="bfloat16", threads=3, sim_gpu="a100")
    assert backend.name == "sim" and "A100" in backend.label


def test_the_sim_names_each_flag_it_ignores_once(capsys):
    assert cli.main([*SIM, "-c", "1", "-r", "1", "-t", "3", "--ubatch", "7"]) == 0
    err = capsys.readouterr().err
    for flag in ("-t 3", "--ubatch 7"):
        assert err.count(f"prefillbench: warning: {flag} is ignored by the sim backend") == 1, err


def test_dtype_on_the_sim_is_priced_or_refused():
    """--dtype, as the torch backend runs weights and KV cache in it, prices the weights on the sim (a different
    --sim-dtype is refused) and the KV cache unless --kv-dtype sets it; float32 is refused in one line."""
    from prefillbench.backends.sim.backend import SimBackend
    from prefillbench.backends.sim.specs import SimConfigError

    fp16 = SimBackend.load("llama-3.1-8b", "h100", dtype="float16").metadata()
    assert fp16 == SimBackend.load("llama-3.1-8b", "h100", sim_dtype="fp16", kv_dtype="fp16").metadata()
    # a preset released in FP8 is priced as asked
    assert (SimBackend.load("deepseek-v3", "h200", tp=8, pp=2, dtype="bfloat16").metadata()["sim_weight_bytes"]
            == SimBackend.load("deepseek-v3", "h200", tp=8, pp=2, sim_dtype="bf16").metadata()["sim_weight_bytes"] == 2.0)
    kept = SimBackend.load("llama-3.1-8b", "h100", dtype="bfloat16", kv_dtype="fp8").metadata()
    assert kept["sim_kv_bytes"] == 1.0 and kept["sim_weight_bytes"] == 2.0
    with pytest.raises(SimConfigError, match=r"^--dtype float32: the sim prices"):
        SimBackend.load("llama-3.1-8b", "h100", dtype="float32")
    with pytest.raises(SimConfigError, match="--dtype float16 and --sim-dtype fp8 disagree"):
        SimBackend.load("llama-3.1-8b", "h100", dtype="float16", sim_dtype="fp8")


def test_dtype_float32_on_the_sim_is_one_line_and_exit_2(run_cli):
    code, out, err = run_cli(*SIM, "-c", "1", "-r", "1", "--dtype", "float32")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--dtype float32" in err


def test_dtype_on_the_gguf_backend_is_named(capsys, use_backend):
    use_backend(stop_at_load)
    assert cli.main(["run", "--backend", "gguf", "--dtype", "bfloat16", "--no-results-file", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("prefillbench: warning: --dtype bfloat16 is ignored by the gguf backend") == 1, err


def test_gpu_layers_on_a_cpu_only_llama_cpp_are_named(capsys, monkeypatch, use_backend):
    from prefillbench.backends import gguf

    monkeypatch.setattr(gguf.llama, "llama_supports_gpu_offload", lambda: False)
    use_backend(stop_at_load)
    assert cli.main(["run", "--backend", "gguf", "-ngl", "99", "--no-results-file", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("prefillbench: warning: -ngl 99 is ignored by the gguf backend "
                     "(this llama-cpp-python was built without GPU offload)") == 1, err
    monkeypatch.setattr(gguf.llama, "llama_supports_gpu_offload", lambda: True)
    assert cli.main(["run", "--backend", "gguf", "-ngl", "99", "--no-results-file", "--no-progress"]) == 2
    assert "warning" not in capsys.readouterr().err


def test_torch_switches_on_gguf_are_named_and_flags_it_takes_are_not(capsys, use_backend):
    use_backend(stop_at_load)
    assert cli.main(["run", "--backend", "gguf", "--no-tune-linear", "-t", "2", "--no-results-file"]) == 2
    err = capsys.readouterr().err
    assert "--no-tune-linear is ignored by the gguf backend" in err and "-t 2" not in err
    assert backend_class("gguf").options >= {"threads", "n_ubatch", "flash_attn"}


# ---------------------------------------------------------------- 28.5: inputs not quietly reinterpreted


@pytest.mark.parametrize("argv, message", [
    (["-r", "0"], "-r 0: at least 1 repetition"),
    (["-c", "4", "--requests", "2"], "--requests 2 is below -c 4"),
    (["--seed", "-1"], "--seed must be 0 or more, got -1"),
])
def test_values_that_would_be_reinterpreted_are_refused(capsys, argv, message):
    assert cli.main([*SIM, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("prefillbench: error:") and message in err, err


def test_repeated_list_values_run_once_with_a_note(capsys):
    assert cli.main([*SIM, "-r", "1", "-c", "1,1,1", "-o", "csv"]) == 0
    out, err = capsys.readouterr()
    assert len(list(csv.DictReader(io.StringIO(out)))) == 1
    assert "prefillbench: note: -c lists 1 more than once; each value runs once" in err


@pytest.mark.parametrize("flag, value", [("--rate", "1,,2"), ("-c", "1,,2"), ("-c", ","), ("-p", "16,"), ("-s", "chunked,,padded"),
                                         ("--pg", "16,,4")])
def test_every_list_flag_refuses_an_empty_item(capsys, flag, value):
    assert cli.main(["run", "--backend", "sim", "--arrival", "poisson", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(rf"'{re.escape(flag)}'", err), err


# ---------------------------------------------------------------- 28.10: help and messages


def _help(capsys, monkeypatch, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_the_strategy_default_is_whole_at_80_columns(capsys, monkeypatch):
    text = " ".join(_help(capsys, monkeypatch, "run").replace("│", " ").split())
    assert f"strategies (default: {', '.join(STRATEGIES)})" in text


def test_help_shows_no_type_where_a_flag_takes_none(capsys, monkeypatch):
    for command in ([], ["run"], ["capacity"], ["compare"], ["plot"], ["calibrate"], ["ab"]):
        assert "<bool>" not in _help(capsys, monkeypatch, *command), command


def test_plot_usage_names_its_files_plainly(capsys, monkeypatch):
    text = _help(capsys, monkeypatch, "plot")
    assert "Usage: prefillbench plot [OPTIONS] FILE..." in text
    assert "{FILE" not in text and "<list[str]>" not in text


@pytest.mark.parametrize("argv, names", [
    (["run", "-o", "xml"], "md, grid, csv, json, jsonl"),
    (["compare", "a.csv", "b.csv", "-o", "xml"], "md, grid, csv, json, jsonl"),
    (["run", "--dtype", "fp8"], "float32, bfloat16, float16"),
    (["run", "--backend", "tpu"], "auto, torch, gguf, sim"),
])
def test_a_bad_choice_is_one_plain_line_listing_the_choices(capsys, argv, names):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and names in err and "Value error" not in err, err


def test_an_empty_folder_as_model_says_it_holds_no_model(capsys, tmp_path, use_backend):
    use_backend(stop_at_load)
    assert cli.main(["run", "-m", str(tmp_path), "--no-results-file"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"-m {tmp_path}: the folder holds no model" in err and "model_type" not in err
