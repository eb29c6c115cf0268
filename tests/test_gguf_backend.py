"""The GGUF (llama.cpp) backend: same numbers as the torch backend, same tokens as llama.cpp itself."""
from __future__ import annotations

import numpy as np
import llama_cpp  # noqa: F401  a hard dependency: a broken install fails these tests, not skips them
import pytest

import prefillbench
from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.backends import gguf as gguf_backend
from prefillbench.backends.base import BackendError
from prefillbench.backends.gguf import GGUFBackend
from prefillbench.models import default_model_path
from prefillbench.step import DecodeToken, PrefillChunk, Step
from prefillbench.sequence import Request
from strategies import STRATEGIES as REGISTRY
from strategies import make_strategy

STRATEGIES = tuple(n for n, c in REGISTRY.items() if not c.needs_price)  # slo-budget: test_slo_budget.py
# Prompt lengths that no chunk size below divides; more requests than slots, so slots are reused.
PROMPT_LENS = (5, 17, 30, 9, 23)
CONCURRENCY = 3
N_GEN = 6
CHUNK = 7


@pytest.fixture(scope="module")
def tiny():
    """The model in tiny_gguf_path: tiny_llama() makes the same weights each time."""
    from tiny_gguf import tiny_llama

    return tiny_llama()


@pytest.fixture(scope="module")
def torch_tiny(tiny):
    from prefillbench.backends.torch.backend import TorchBackend

    return TorchBackend(tiny, "tiny")


@pytest.fixture(scope="module")
def exact_tiny(tiny_gguf_path):
    """float32 KV cache and no flash attention: llama.cpp computes in float32 throughout."""
    backend = GGUFBackend.load(tiny_gguf_path, kv_type="f32", flash_attn=False, threads=1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def default_tiny(tiny_gguf_path):
    """llama.cpp's defaults: f16 KV cache, flash attention as llama.cpp decides."""
    backend = GGUFBackend.load(tiny_gguf_path, threads=1)
    yield backend
    backend.close()


def workload(vocab: int = 49152, seed: int = 1) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(tuple(int(t) for t in rng.integers(3, vocab, n)), N_GEN) for n in PROMPT_LENS]


def run(backend, strategy: str, requests, keep_logits: bool = False):
    return engine.run(backend, make_strategy(strategy, CHUNK), requests, CONCURRENCY, keep_logits=keep_logits)


def tokens(record) -> list[list[int]]:
    return [r.tokens for r in record.requests]


# -- the tiny random Llama on both backends ----------------------------------


def test_loads_as_quantization_free_llama(exact_tiny):
    assert exact_tiny.vocab_size == 49152
    assert exact_tiny.context_length == 1024
    assert "F32" in exact_tiny.weights and "quantized" not in exact_tiny.weights


def test_logits_match_torch_for_every_strategy(exact_tiny, torch_tiny):
    requests = workload()
    ref = run(torch_tiny, "sequential", requests, keep_logits=True)
    for name in STRATEGIES:
        got = run(exact_tiny, name, requests, keep_logits=True)
        assert tokens(got) == tokens(ref), name
        for r_got, r_ref in zip(got.requests, ref.requests):
            diff = np.abs(np.stack(r_got.logits) - np.stack(r_ref.logits)).max()
            assert diff < 2e-3, f"{name}: logits differ by {diff}"


def test_mixed_step_with_pads_matches_torch(exact_tiny, torch_tiny):
    """One llama_decode with a chunk at an offset, a padded chunk and decode tokens."""
    rng = np.random.default_rng(7)
    a = tuple(int(t) for t in rng.integers(3, 49152, 11))
    b = tuple(int(t) for t in rng.integers(3, 49152, 6))
    c = tuple(int(t) for t in rng.integers(3, 49152, 9))
    results = []
    for backend in (exact_tiny, torch_tiny):
        backend.prepare(3, 32, 64)
        first = backend.execute(Step(prefills=(PrefillChunk(0, a[:4], 0, False), PrefillChunk(1, c, 0, True))))
        mixed = Step(
            prefills=(PrefillChunk(0, a[4:], 4, True), PrefillChunk(2, b, 0, True, pad=5)),
            decodes=(DecodeToken(1, first.next_tokens[1], len(c)),),
        )
        second = backend.execute(mixed, return_logits=True)
        # The padded sequence continues right after its real tokens.
        third = backend.execute(Step(decodes=(DecodeToken(2, second.next_tokens[2], len(b)),)), return_logits=True)
        results.append((second, third))
        for seq in (0, 1, 2):
            backend.release(seq)
    (g2, g3), (t2, t3) = results
    assert g2.next_tokens == t2.next_tokens and g3.next_tokens == t3.next_tokens
    for seq in (0, 1, 2):
        assert np.abs(g2.logits[seq] - t2.logits[seq]).max() < 2e-3
    assert np.abs(g3.logits[2] - t3.logits[2]).max() < 2e-3


def test_pads_change_no_result(exact_tiny):
    rng = np.random.default_rng(3)
    prompt = tuple(int(t) for t in rng.integers(3, 49152, 8))
    out = []
    for pad in (0, 9):
        exact_tiny.prepare(1, 32, 32)
        r = exact_tiny.execute(Step(prefills=(PrefillChunk(0, prompt, 0, True, pad=pad),)), return_logits=True)
        r2 = exact_tiny.execute(Step(decodes=(DecodeToken(0, r.next_tokens[0], len(prompt)),)), return_logits=True)
        out.append((r.logits[0], r2.logits[0]))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_allclose(out[0][1], out[1][1], atol=1e-5)


def _ragged_steps(tok):
    """Steps as multi-chunk strategies (packed, sarathi-serve) build them: several prompt chunks of
    different lengths and offsets in one step, with and without the decodes of other sequences."""
    prompts = {0: tok(11), 1: tok(6), 2: tok(9), 3: tok(13)}
    return prompts, [
        lambda nxt: Step(prefills=(PrefillChunk(2, prompts[2], 0, True), PrefillChunk(0, prompts[0][:4], 0, False))),
        lambda nxt: Step(
            prefills=(PrefillChunk(0, prompts[0][4:], 4, True), PrefillChunk(1, prompts[1], 0, True),
                      PrefillChunk(3, prompts[3][:5], 0, False)),
            decodes=(DecodeToken(2, nxt[2][-1], 9),),
        ),
        lambda nxt: Step(
            prefills=(PrefillChunk(3, prompts[3][5:], 5, True),),
            decodes=(DecodeToken(0, nxt[0][-1], 11), DecodeToken(1, nxt[1][-1], 6), DecodeToken(2, nxt[2][-1], 10)),
        ),
        lambda nxt: Step(decodes=tuple(DecodeToken(s, nxt[s][-1], len(prompts[s]) + len(nxt[s]) - 1) for s in (3, 1, 0))),
    ]


@pytest.mark.parametrize("kv_unified", [False, True], ids=["kv-streams", "kv-unified"])
def test_ragged_multi_chunk_steps_match_each_sequence_alone(tiny_gguf_path, kv_unified):
    """Several chunks of different lengths and offsets plus decodes in one step give each sequence
    what it gets when it runs alone, one prompt step and one decode step at a time."""
    backend = GGUFBackend.load(tiny_gguf_path, kv_type="f32", flash_attn="off", kv_unified=kv_unified, threads=1)
    rng = np.random.default_rng(11)
    prompts, steps = _ragged_steps(lambda n: tuple(int(t) for t in rng.integers(3, 49152, n)))
    backend.prepare(4, 32, 64)
    got_tokens: dict[int, list[int]] = {s: [] for s in prompts}
    got_logits: dict[int, list[np.ndarray]] = {s: [] for s in prompts}
    for make in steps:
        result = backend.execute(make(got_tokens), return_logits=True)
        for seq, token in result.next_tokens.items():
            got_tokens[seq].append(token)
            got_logits[seq].append(result.logits[seq])
    for seq in prompts:
        backend.release(seq)
    assert all(len(v) for v in got_tokens.values())
    for seq, prompt in prompts.items():
        backend.prepare(1, 32, 32)
        ref = backend.execute(Step(prefills=(PrefillChunk(seq, prompt, 0, True),)), return_logits=True)
        ref_tokens, ref_logits = [ref.next_tokens[seq]], [ref.logits[seq]]
        while len(ref_tokens) < len(got_tokens[seq]):
            r = backend.execute(Step(decodes=(DecodeToken(seq, ref_tokens[-1], len(prompt) + len(ref_tokens) - 1),)),
                                return_logits=True)
            ref_tokens.append(r.next_tokens[seq])
            ref_logits.append(r.logits[seq])
        backend.release(seq)
        assert got_tokens[seq] == ref_tokens, seq
        diff = np.abs(np.stack(got_logits[seq]) - np.stack(ref_logits)).max()
        assert diff < 1e-3, f"sequence {seq}: logits differ by {diff}"
    backend.close()


def test_greedy_tokens_agree_across_strategies_with_llama_cpp_defaults(default_tiny, exact_tiny):
    requests = workload(seed=2)
    ref = tokens(run(exact_tiny, "sequential", requests))
    for name in STRATEGIES:
        assert tokens(run(default_tiny, name, requests)) == ref, name


def test_context_is_reused_until_a_run_needs_more(tiny_gguf_path):
    backend = GGUFBackend.load(tiny_gguf_path, threads=1)
    backend.prepare(2, 64, 64)
    backend.prepare(2, 32, 16)
    assert backend.contexts_created == 1
    backend.prepare(4, 64, 64)
    assert backend.contexts_created == 2
    assert backend.n_ctx >= 256 and backend.n_seq_max >= 4
    # Fewer but longer sequences: each one's cells (its own KV stream) must grow too.
    backend.prepare(1, 512, 64)
    assert backend.contexts_created == 3 and backend.n_ctx_seq >= 512 and backend.n_seq_max >= 4
    backend.prepare(2, 512, 64)
    assert backend.contexts_created == 3
    backend.close()


@pytest.mark.parametrize("setting", ["on", "off", "auto"])
def test_flash_attention_setting_reaches_llama_cpp_and_metadata(tiny_gguf_path, setting):
    backend = load_backend("gguf", tiny_gguf_path, threads=1, flash_attn=setting)
    backend.prepare(1, 32, 32)
    r = backend.execute(Step(prefills=(PrefillChunk(0, tuple(range(3, 13)), 0, True),)))
    assert set(r.next_tokens) == {0}
    meta = backend.metadata()
    assert meta["flash_attn"] == setting and meta["kv_unified"] is False
    backend.close()


def test_flash_attention_default_and_bad_setting(tiny_gguf_path):
    backend = GGUFBackend.load(tiny_gguf_path, threads=1)
    assert backend.metadata()["flash_attn"] == gguf_backend.DEFAULT_FLASH_ATTN
    backend.close()
    with pytest.raises(BackendError, match="flash attention.*on, off, auto"):
        GGUFBackend.load(tiny_gguf_path, flash_attn="sometimes")


def test_metadata_reports_batching_and_versions(tiny_gguf_path):
    backend = GGUFBackend.load(tiny_gguf_path, n_ubatch=8, threads=1)
    backend.prepare(1, 32, 32)
    backend.execute(Step(prefills=(PrefillChunk(0, tuple(range(3, 23)), 0, True),)))
    meta = backend.metadata()
    assert meta["n_ubatch"] == 8 and meta["n_batch"] >= 32 and meta["threads"] == 1
    assert meta["split_steps"] == 1 and "splits" in meta["ubatch_split"]
    assert meta["llama_cpp_python"] and meta["llama_cpp"]
    backend.close()


def test_load_backend_and_auto_pick_gguf(tiny_gguf_path, monkeypatch):
    from prefillbench import backends

    backend = load_backend("gguf", tiny_gguf_path)
    assert backend.name == "gguf" and backend.label == "gguf CPU"
    backend.close()
    monkeypatch.setattr(backends, "cuda_available", lambda: False)
    assert backends.resolve_backend_name("auto") == "gguf"
    auto = load_backend("auto", tiny_gguf_path)
    assert auto.name == "gguf"
    auto.close()
    # A checkpoint folder or hub id is not something llama.cpp can run: auto picks torch for it.
    from prefillbench.backends.torch import backend as torch_backend

    monkeypatch.setattr(torch_backend.TorchBackend, "load", classmethod(lambda cls, model, **kw: ("torch", model)))
    assert load_backend("auto", "HuggingFaceTB/SmolLM2-135M-Instruct") == ("torch", "HuggingFaceTB/SmolLM2-135M-Instruct")


# -- bad input ----------------------------------------------------------------


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"this is not a model\n")
    with pytest.raises(BackendError, match="not a GGUF file"):
        GGUFBackend.load(str(bad))
    with pytest.raises(BackendError, match="not found"):
        GGUFBackend.load(str(tmp_path / "missing.gguf"))


def test_unknown_architecture(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    writer = GGUFWriter(str(path), "no-such-arch")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(BackendError, match="unknown model architecture"):
        GGUFBackend.load(str(path))


def test_context_too_small_says_what_it_needs(tiny_gguf_path):
    backend = GGUFBackend.load(tiny_gguf_path, n_ctx=100)
    with pytest.raises(BackendError, match=r"n_ctx >= 128"):
        backend.prepare(4, 32, 40)
    with pytest.raises(BackendError, match=r"n_ctx >= 120"):
        engine.run(backend, make_strategy("padded"), [Request((5,) * 20, 10)] * 4, 4)
    backend.close()


def test_decode_failure_is_a_backend_error(tiny_gguf_path):
    backend = GGUFBackend.load(tiny_gguf_path, threads=1)
    backend.prepare(2, 128, 256)
    cells = backend.n_ctx
    seq_len = cells // 2
    backend.max_seq_len = cells  # let the chunks through to llama.cpp, which runs out of cells
    backend.execute(Step(prefills=(PrefillChunk(0, (5,) * seq_len, 0, True),)))
    backend.execute(Step(prefills=(PrefillChunk(1, (5,) * seq_len, 0, True),)))
    with pytest.raises(BackendError, match="no free KV cache cells"):
        backend.execute(Step(decodes=(DecodeToken(0, 5, seq_len),)))
    backend.close()


def test_missing_llama_cpp_is_a_clear_error(monkeypatch, tiny_gguf_path):
    monkeypatch.setattr(gguf_backend, "llama", None)
    with pytest.raises(BackendError, match="llama-cpp-python"):
        load_backend("gguf", tiny_gguf_path)


# -- the shipped SmolLM2 GGUF against llama-cpp-python's own generation --------

# Greedy continuations whose top-2 logit margin stays above 2 for all 8 tokens. llama.cpp's quantized
# CPU kernels are not batch-invariant: a token's logits move by up to ~1 with its row offset inside
# the ubatch (the padded batch shifts the rows), so a near-tie prompt may legitimately flip a token.
SMOL_PROMPTS = ("a b c d e f", "A, B, C, D, E,", "2, 4, 6, 8, 10, 12,")
SMOL_GEN = 8


@pytest.fixture(scope="module")
def smol_reference():
    """Prompts, greedy tokens and first-token logits from llama-cpp-python's high-level Llama."""
    from prefillbench.backends.llama_kernels import reference_llama

    llm = reference_llama(default_model_path(), n_ctx=256, n_threads=1, n_threads_batch=1, logits_all=True, verbose=False)
    prompts, expected, first_logits = [], [], []
    for text in SMOL_PROMPTS:
        prompt = llm.tokenize(text.encode(), add_bos=False)
        llm.reset()
        llm.eval(prompt)
        first_logits.append(np.array(llm.scores[llm.n_tokens - 1]))
        out = []
        for _ in range(SMOL_GEN):
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([out[-1]])
        prompts.append(prompt)
        expected.append(out)
    llm.close()
    gguf_backend.install_log()  # Llama() installed its own logger
    return prompts, expected, first_logits


@pytest.fixture(scope="module")
def smol():
    # Llama() runs without flash attention by default; match it so the first logits are comparable.
    backend = GGUFBackend.load(default_model_path(), flash_attn=False, threads=1)
    yield backend
    backend.close()


def test_smollm2_matches_llama_cpp_python(smol, smol_reference):
    prompts, expected, first_logits = smol_reference
    assert "Q4_1" in smol.weights and "quantized" in smol.weights
    requests = [Request(tuple(p), SMOL_GEN) for p in prompts]
    for name in STRATEGIES:
        for concurrency in (1, len(prompts)):
            record = engine.run(smol, make_strategy(name, 4), requests, concurrency, keep_logits=(name == "sequential"))
            assert tokens(record) == expected, f"{name} c={concurrency}"
            if name == "sequential" and concurrency == 1:
                # The same prompt in the same single ubatch: the same numbers as llama-cpp-python's eval.
                for req, ref in zip(record.requests, first_logits):
                    assert np.abs(req.logits[0] - ref).max() < 1e-3


def test_generate_api_with_gguf_backend(smol_reference):
    prompts, expected, _ = smol_reference
    got = prefillbench.generate(prompts, backend="gguf", strategy="chunked", chunk_size=4, max_new_tokens=SMOL_GEN)
    assert got == expected


# -- the command line -----------------------------------------------------------


def test_cli_runs_the_gguf_backend(tiny_gguf_path, capsys):
    from prefillbench import cli

    rc = cli.main(["run", "--backend", "gguf", "-m", tiny_gguf_path, "-t", "1", "-p", "8", "-n", "2", "-c", "1,2",
                   "-s", "sequential,padded,chunked", "--chunk-size", "3", "-r", "1", "--no-results-file",
                   "--no-progress", "--verify"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "gguf CPU" in captured.out
    assert "weights: all F32 (as stored)" in captured.err
    assert "verify: all 8 comparisons agree within tolerance" in captured.err  # padded, chunked x pp8, tg2 x c=1, 2


def test_cli_error_for_a_file_that_is_not_gguf(tmp_path, capsys):
    from prefillbench import cli

    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    assert cli.main(["run", "--backend", "gguf", "-m", str(bad), "-p", "8", "-n", "0", "--no-results-file", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a GGUF file" in err[0]


@pytest.mark.parametrize("setting", ["off", "on"])
def test_cli_flash_attention_flag_reaches_the_exported_metadata(tiny_gguf_path, tmp_path, capsys, setting):
    import json

    from prefillbench import cli

    export = tmp_path / "run.json"
    rc = cli.main(["run", "--backend", "gguf", "-m", tiny_gguf_path, "-t", "1", "-fa", setting, "-p", "8", "-n", "0",
                   "-c", "1", "-s", "sequential", "-r", "1", "--no-warmup", "--no-results-file", "--no-progress",
                   "--export", str(export)])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads(export.read_text())["metadata"]
    assert meta["flash_attn"] == setting and meta["kv_unified"] is False


def test_cli_rejects_an_unknown_flash_attention_value(tiny_gguf_path, capsys):
    from prefillbench import cli

    rc = cli.main(["run", "--backend", "gguf", "-m", tiny_gguf_path, "--flash-attn", "maybe", "-p", "8", "-n", "0",
                   "--no-results-file", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "prefillbench: error:" in err[0] and "flash-attn" in err[0]


def _system_info(text: str):
    return lambda: text.encode()


@pytest.mark.parametrize("info, expect_on", [
    ("CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |", False),
    ("CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 0 | REPACK = 1 |", True),
    ("CPU : AVX2 = 1 | REPACK = 1 |", True),
])
def test_extra_buffers_off_on_amx_cpus_only(monkeypatch, info, expect_on):
    """llama.cpp's AMX matrix product segfaults on AMX CPUs (llama.cpp#20824): there, and only there, the extra
    buffer types are off by default; the variable overrides either way and a bad value is refused."""
    from prefillbench.backends import llama_kernels as kernels

    monkeypatch.delenv(kernels.EXTRA_BUFFERS_VARIABLE, raising=False)
    monkeypatch.setattr(kernels.llama, "llama_print_system_info", _system_info(info))
    on, why = kernels.extra_buffers()
    assert on is expect_on
    assert ("llama.cpp#20824" in why) is (not expect_on)
    for asked in ("0", "1"):
        monkeypatch.setenv(kernels.EXTRA_BUFFERS_VARIABLE, asked)
        assert kernels.extra_buffers()[0] is (asked == "1")
    monkeypatch.setenv(kernels.EXTRA_BUFFERS_VARIABLE, "yes")
    with pytest.raises(BackendError, match="must be 0 or 1"):
        kernels.extra_buffers()


def test_the_backend_loads_with_the_decision(tiny_gguf_path, monkeypatch):
    from prefillbench.backends import llama_kernels as kernels

    monkeypatch.setenv(kernels.EXTRA_BUFFERS_VARIABLE, "0")
    backend = GGUFBackend.load(str(tiny_gguf_path), threads=1)
    try:
        assert backend.metadata()["llama_extra_buffers"] == f"${kernels.EXTRA_BUFFERS_VARIABLE}=0"
    finally:
        backend.close()
