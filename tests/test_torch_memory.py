"""The torch backend plans its memory before the run: sequences clamped to what fits, or refused in one line."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prefillbench import cli, engine
from prefillbench.backends.base import BackendError
from prefillbench.backends.torch import memory
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.sequence import Request
from strategies import make_strategy
from tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [tuple(range(3 + i, 40 + i)) for i in range(8)]


def _free(n_bytes: int):
    return lambda device: memory.FreeMemory(n_bytes, "in this test")


def _room_for(backend: TorchBackend, sequences: int, max_seq_len: int, max_step_tokens: int) -> int:
    """The fewest free bytes in which `sequences` sequences fit."""
    lo, hi = 0, 1 << 40
    while hi - lo > 1:
        mid = (lo + hi) // 2
        backend.free_memory = _free(mid)
        lo, hi = (lo, mid) if backend.max_concurrency(max_seq_len, max_step_tokens) >= sequences else (mid, hi)
    return hi


def test_the_sequences_in_flight_are_clamped_to_what_fits_with_a_line_saying_so(capsys):
    model, _ = tiny_model("llama")
    requests = [Request(p, 4) for p in PROMPTS]
    alone = engine.run(TorchBackend(tiny_model("llama")[0], "tiny"), make_strategy("chunked", 16), requests, 8)
    backend = TorchBackend(model, "tiny")
    strategy = make_strategy("chunked", 16)
    backend.free_memory = _free(_room_for(backend, 3, 41, strategy.max_step_tokens(37, 3)))
    record = engine.run(backend, strategy, requests, 8)
    err = capsys.readouterr().err
    assert "prefillbench: torch: only 3 of 8 sequences fit in the " in err and "GiB free in this test beside the weights" in err
    assert backend.cache.n_slots == 3 and backend.metadata()["concurrency_clamped"] == "8->3"
    assert [r.tokens for r in record.requests] == [r.tokens for r in alone.requests]  # clamped, not changed


def test_a_request_of_which_not_one_sequence_fits_is_refused_with_what_it_needs_and_what_there_is():
    backend = TorchBackend(tiny_model("llama")[0], "tiny")
    backend.free_memory = _free(1 << 16)
    with pytest.raises(BackendError, match=r"not one sequence of 41 tokens fits in the 0.00 GiB free in this test beside the "
                                           r"weights: each sequence of 41 tokens needs 0.000 GiB of KV cache"):
        engine.run(backend, make_strategy("sequential", 16), [Request(p, 4) for p in PROMPTS], 8)
    assert backend.cache is None  # refused before anything was allocated


def test_the_cli_refuses_it_in_one_line_and_exits_2(tmp_path, monkeypatch, capsys):
    model, _ = tiny_model("llama")
    model.save_pretrained(tmp_path / "tiny")
    monkeypatch.setattr(memory, "free_memory", _free(1 << 16))
    code = cli.main(["run", "--backend", "torch", "-m", str(tmp_path / "tiny"), "-p", "32", "-n", "0", "-c", "2", "-r", "1",
                     "-s", "sequential", "--no-progress", "--no-results-file"])
    err = capsys.readouterr().err
    assert code == 2
    refusal = [line for line in err.splitlines() if "error" in line]
    assert len(refusal) == 1 and "not one sequence of 33 tokens fits in the 0.00 GiB free in this test" in refusal[0]
    assert "Traceback" not in err


def test_host_free_memory_reads_the_address_space_limit():
    # A subprocess: the limit stays with it.
    script = textwrap.dedent("""
        import resource
        from prefillbench.backends.torch import memory
        used = memory._status_kib("VmSize")
        resource.setrlimit(resource.RLIMIT_AS, (used + (300 << 20), resource.RLIM_INFINITY))
        free = memory.host_free()
        assert "RLIMIT_AS" in free.where and 0 < free.bytes <= 300 << 20, free
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_under_an_address_space_limit_what_the_plan_allows_allocates_and_thrice_that_is_a_clear_error():
    script = textwrap.dedent("""
        import resource
        from prefillbench.backends.base import BackendError
        from prefillbench.backends.torch import memory
        from prefillbench.backends.torch.backend import TorchBackend
        from tiny_models import tiny_model
        backend = TorchBackend(tiny_model("llama", hidden_size=256)[0], "tiny")
        backend.prepare(1, 64, 64)  # the tuner and kernels set up, as after a first case
        resource.setrlimit(resource.RLIMIT_AS, (memory._status_kib("VmSize") + (400 << 20), resource.RLIM_INFINITY))
        fits = backend.max_concurrency(256, 64)
        assert 100 < fits < 4000, fits  # 2 KiB of K and V a token: about 0.5 MiB a sequence
        backend.prepare(fits, 256, 64)
        backend.cache = None
        try:
            backend.prepare(3 * fits, 256, 64)
        except BackendError as e:
            assert str(e).startswith(f"cannot allocate the KV cache of {3 * fits} sequences of 256 tokens"), e
            print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
