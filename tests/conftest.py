import os
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

# Tests import their helpers (tiny_models, ...) as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))

# The kernel tests check the C kernels' own paths: every kernel that builds runs, untimed. The timed
# decisions have tests of their own (test_cpu_isa), which set the variable as they need.
os.environ.setdefault("PREFILLBENCH_KERNEL_DECISION", "kernel")

# Every process this session starts inherits this mark (tests/processes.py): the checks that no server outlived its
# command count this session's servers only, not another session's on the same machine.
os.environ["PREFILLBENCH_TEST_SESSION"] = str(os.getpid())


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> str:
    """A tiny random Llama saved as a transformers checkpoint folder (4 heads, 2 KV heads: one KV head a rank
    at tp=2)."""
    from tiny_models import tiny_model

    model, _ = tiny_model("llama")
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A tiny random Llama (seeded) saved as a transformers checkpoint, its positions 1,024: calibrate sweeps it."""
    import torch
    from transformers import AutoModelForCausalLM

    from tiny_models import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", max_position_embeddings=1024))
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_gguf_path(tmp_path_factory) -> str:
    """tiny_gguf.tiny_llama() (seed 0) as a float32 GGUF file: the same weights as a fresh tiny_llama()."""
    from tiny_gguf import tiny_llama, write_gguf

    return str(write_gguf(tiny_llama(), tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


class CliResult(NamedTuple):
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys):
    """run_cli(*argv): the command line's exit code and what it printed, as (code, out, err)."""
    from prefillbench import cli

    def run(*argv: str) -> CliResult:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


@pytest.fixture
def use_backend(monkeypatch):
    """use_backend(load): every command loads its backend with `load` (load_backend's signature), in place of
    prefillbench.backends.load_backend, wherever a module holds it. For a plain FakeBackend, prefer the command
    line's `--backend fake`."""
    import prefillbench.backends

    real = prefillbench.backends.load_backend
    fakes = []

    def use(load) -> None:
        for module in list(sys.modules.values()):
            held = getattr(module, "__dict__", {}).get("load_backend")
            if held is real or any(held is f for f in fakes):
                monkeypatch.setattr(module, "load_backend", load)
        fakes.append(load)

    yield use
    # A module first imported while patched took the fake from prefillbench.backends: give it back the real one.
    for module in list(sys.modules.values()):
        held = getattr(module, "__dict__", {}).get("load_backend")
        if any(held is f for f in fakes):
            module.load_backend = real


#: Test modules whose outcomes rest on floating-point kernels (BLAS, ATen's vectorized ops, least squares): `make
#: test-lower-isa` runs them again with the lower ISA forced, so that an AVX-512 or AMX machine also checks what an
#: AVX2 one computes. Their tolerances come from the numerics, so both passes must hold on every machine.
NUMERICS = {"test_sim_calibrate_measured", "test_sim_calibrate", "test_sim_pricing", "test_shipped_curves", "test_measured_attention_net",
            "test_stats", "test_layers", "test_torch_linear", "test_verify", "test_cpu_layer_ops",
            "test_cpu_prefill_attention", "test_cpu_decode_attention", "test_cpu_few_rows"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in NUMERICS:
            item.add_marker(pytest.mark.numerics)
