"""The strategies that are serving engines' own schedules: `vllm-v1` (vLLM 0.32's Scheduler.schedule) and
`llama-server` (llama.cpp's update_slots), their rules on hand-built sequences, and each engine's own steps against
its strategy on the sim, step for step: a real vLLM (one eager launch; `make test` installs vLLM first, `make vllm`)
and a real llama-server (`make server`)."""
from __future__ import annotations

from processes import session_processes

from prefillbench import engine
from prefillbench.backends.fake import FakeBackend
from prefillbench.sequence import Request, Sequence
from prefillbench.step import Step
from strategies import make_strategy


def layout(step: Step) -> tuple[list[tuple[int, int, int]], list[int]]:
    """(sequence, start, length) of each prompt chunk, and the decoding sequences, in step order."""
    return [(c.seq_id, c.start, len(c.tokens)) for c in step.prefills], [d.seq_id for d in step.decodes]


def seq(i: int, prompt_len: int, prefilled: int = 0, generated=(), n_gen: int = 4) -> Sequence:
    s = Sequence(i, tuple(range(prompt_len)), n_gen, 0.0, n_prefilled=prefilled)
    s.generated = list(generated)
    return s


def decoding(i: int, prompt_len: int = 3) -> Sequence:
    return seq(i, prompt_len, prompt_len, [7])


def schedule(name: str, size: int, requests, concurrency: int) -> list:
    backend = FakeBackend()
    engine.run(backend, make_strategy(name, size), requests, concurrency)
    return [layout(s) for s in backend.steps]


# ---------------------------------------------------------------- vllm-v1: Scheduler.schedule


def test_vllm_v1_spends_one_budget_on_running_requests_first_then_waiting_ones_fcfs():
    # RUNNING (two decodes) take 2 of the 8 tokens; WAITING, FCFS: request 2 takes the other 6, request 3 none
    step = make_strategy("vllm-v1", 8).next_step([seq(2, 10), seq(3, 5)], [decoding(0), decoding(1)])
    assert layout(step) == ([(2, 0, 6)], [0, 1])


def test_vllm_v1_continues_a_prompt_in_progress_before_a_new_one():
    # request 0 was scheduled once (it is in RUNNING, before request 1's decode): its 4 tokens left, then the
    # decode, then 1 token of the new request 2
    step = make_strategy("vllm-v1", 6).next_step([seq(0, 9, 5), seq(2, 9)], [decoding(1)])
    assert layout(step) == ([(0, 5, 4), (2, 0, 1)], [1])


def test_vllm_v1_lets_an_older_prompt_in_progress_starve_a_younger_decode():
    # the RUNNING loop goes in order and stops at budget 0: request 1's decode gets nothing this step (vLLM; with
    # its default threshold a younger decode cannot exist, but the rule is the code's). sarathi-serve differs.
    waiting, running = [seq(0, 20, 2)], [decoding(1)]
    assert layout(make_strategy("vllm-v1", 4).next_step(waiting, running)) == ([(0, 2, 4)], [])
    assert layout(make_strategy("sarathi-serve", 4).next_step(waiting, running)) == ([(0, 2, 3)], [1])


def test_vllm_v1_caps_decodes_at_the_budget_too():
    # more running requests than budget (vLLM refuses max_num_seqs > max_num_batched_tokens, the engine here does
    # not): the first ones in RUNNING order decode, the rest wait a step
    step = make_strategy("vllm-v1", 2).next_step([seq(9, 5)], [decoding(i) for i in range(3)])
    assert layout(step) == ([], [0, 1])


def test_vllm_v1_long_prefill_threshold_caps_each_prompt_unless_it_is_alone():
    strategy = make_strategy("vllm-v1", 8)
    strategy.long_prefill_token_threshold = 3
    assert layout(strategy.next_step([seq(0, 10), seq(1, 10)], [])) == ([(0, 0, 3), (1, 0, 3)], [])
    assert layout(strategy.next_step([seq(0, 10, 3)], [])) == ([(0, 3, 7)], [])  # the only request: no cap
    # two prompts in progress and a decode in seq_id order: a prompt older than a decode goes before it
    step = strategy.next_step([seq(0, 10, 3), seq(2, 10, 3)], [decoding(1)])
    assert layout(step) == ([(0, 3, 3), (2, 3, 3)], [1])


def test_vllm_v1_max_num_seqs_stops_new_requests_not_running_ones():
    strategy = make_strategy("vllm-v1", 16)
    strategy.max_num_seqs = 2
    step = strategy.next_step([seq(1, 9, 4), seq(2, 9)], [decoding(0)])
    assert layout(step) == ([(1, 4, 5)], [0])  # two running already: request 2 waits with budget left


def test_vllm_v1_runs_like_sarathi_serve_at_the_presets_defaults():
    # with no threshold, at most one prompt is in progress and it is the youngest running one: the budget goes
    # to decodes, that prompt, then new ones, Sarathi-Serve's order (which vLLM's own steps confirm, below)
    requests = [Request(tuple(range(10, 16)), 3), Request(tuple(range(20, 23)), 1), Request(tuple(range(30, 34)), 2)]
    steps = schedule("vllm-v1", 4, requests, 2)
    assert steps == [
        ([(0, 0, 4)], []),
        ([(0, 4, 2), (1, 0, 2)], []),
        ([(1, 2, 1)], [0]),
        ([(2, 0, 3)], [0]),
        ([(2, 3, 1)], []),
        ([], [2]),
    ]
    assert steps == schedule("sarathi-serve", 4, requests, 2)


def drafting(i: int, drafts, prompt_len: int = 3) -> Sequence:
    s = decoding(i, prompt_len)
    s.drafts = list(drafts)
    return s


def fed_drafts(step: Step) -> dict[int, tuple[int, ...]]:
    return {d.seq_id: d.drafts for d in step.decodes}


def test_vllm_v1_charges_drafts_to_the_budget_and_cuts_them_to_what_is_left():
    from prefillbench.speculation import parse_spec

    strategy = make_strategy("vllm-v1", 6)
    strategy.speculation = parse_spec("ngram:3")
    assert strategy.speculation_warnings()  # a budget under 8192: vLLM's warning, named
    # request 0 asks 1+3, request 1 1+3: 4 + 2 of the 6, its drafts cut to 1 (spec_token_ids[:1]); no room for 2
    step = strategy.next_step([seq(2, 10)], [drafting(0, (7, 8, 9)), drafting(1, (4, 5, 6))])
    assert layout(step) == ([], [0, 1]) and fed_drafts(step) == {0: (7, 8, 9), 1: (4,)}
    assert step.n_tokens == 6
    # with room to spare the new prompt takes the rest, after every draft
    strategy = make_strategy("vllm-v1", 12)
    strategy.speculation = parse_spec("ngram:3")
    step = strategy.next_step([seq(2, 10)], [drafting(0, (7, 8, 9)), drafting(1, (4, 5))])
    assert layout(step) == ([(2, 0, 5)], [0, 1]) and step.n_decode_tokens == 7
    # a budget of 8192 or more: no warning
    wide = make_strategy("vllm-v1", 8192)
    wide.speculation = parse_spec("ngram:3")
    assert wide.speculation_warnings() == []


def test_vllm_v1_gives_eagle_k_lookahead_slots_and_a_draft_model_an_input_slot_a_request():
    from prefillbench.engine.memory import KVMemory
    from prefillbench.speculation import parse_spec

    def with_memory(spec: str, blocks: int):
        strategy = make_strategy("vllm-v1", 64)
        strategy.kv_block_size = 4
        memory = KVMemory(blocks * 4, 4)
        memory.grow(0, 4)  # request 0 holds its 3 prompt tokens and its first output: one block, full
        strategy.attach(memory)
        strategy.speculation = parse_spec(spec)
        return strategy

    running = [drafting(0, (7, 8))]  # 4 tokens computed but the newest; 1+2 more: 6 in all, two blocks
    # ngram: no lookahead, so one block more fits in a memory of 2
    assert layout(with_memory("ngram:2", 2).next_step([], running)) == ([], [0])
    # eagle: K=2 lookahead slots more, 8 tokens, still two blocks; K=3 asks 9, three blocks: the request is preempted
    assert layout(with_memory("eagle:2:accept=0.5", 2).next_step([], running)) == ([], [0])
    step = with_memory("eagle:3:accept=0.5", 2).next_step([], [drafting(0, (7, 8))])
    assert [p.seq_id for p in step.preempted] == [0] and not step.decodes
    # a draft model: every scheduled request takes one input slot more (max_num_new_slots_for_drafting)
    strategy = make_strategy("vllm-v1", 8)
    strategy.speculation = parse_spec("draft:2:accept=0.5")
    step = strategy.next_step([seq(2, 10)], [drafting(0, (7, 8)), drafting(1, (4, 5))])
    # request 0: 3 tokens, 4 inputs; request 1: min(3, 8-3, 4-1) = 3, 4 inputs; nothing left for request 2
    assert layout(step) == ([], [0, 1]) and fed_drafts(step) == {0: (7, 8), 1: (4, 5)}
    step = strategy.next_step([seq(2, 10)], [drafting(0, (7, 8)), drafting(1, (4, 5, 6))])
    assert fed_drafts(step) == {0: (7, 8), 1: (4, 5)}  # 3 inputs left less its slot: 2 drafts


def test_vllm_v1_dynamic_k_cuts_drafts_to_the_k_of_the_batch_before():
    from prefillbench.speculation import parse_spec

    strategy = make_strategy("vllm-v1", 64)
    strategy.speculation = parse_spec("ngram:3:batch=1-1/3+2-8/1")
    one = strategy.next_step([], [drafting(0, (7, 8, 9))])  # the first step: K for no batch yet, 3
    assert fed_drafts(one) == {0: (7, 8, 9)}
    two = strategy.next_step([], [drafting(0, (7, 8, 9)), drafting(1, (4, 5, 6))])  # after a batch of 1: K=3
    assert fed_drafts(two) == {0: (7, 8, 9), 1: (4, 5, 6)}
    three = strategy.next_step([], [drafting(0, (7, 8, 9)), drafting(1, (4, 5, 6))])  # after a batch of 2: K=1
    assert fed_drafts(three) == {0: (7,), 1: (4,)}


def test_vllm_v1_long_prefill_threshold_caps_a_decode_with_drafts_too():
    from prefillbench.speculation import parse_spec

    strategy = make_strategy("vllm-v1", 64)
    strategy.long_prefill_token_threshold = 2
    strategy.speculation = parse_spec("ngram:3")
    step = strategy.next_step([seq(2, 10)], [drafting(0, (7, 8, 9))])
    assert fed_drafts(step) == {0: (7,)} and layout(step) == ([(2, 0, 2)], [0])


# ---------------------------------------------------------------- llama-server: update_slots


def test_llama_server_takes_prompts_in_slot_order_and_a_fresh_server_gives_the_newest_the_lowest_slot():
    # three requests at once on 3 slots: request 0 gets slot 2, request 1 slot 1, request 2 slot 0; prompts go
    # in slot order, so request 2's first
    requests = [Request(tuple(range(5)), 2), Request(tuple(range(5)), 2), Request(tuple(range(5)), 2)]
    steps = schedule("llama-server", 8, requests, 3)
    assert steps[0] == ([(2, 0, 5), (1, 0, 3)], [])
    assert steps[1] == ([(1, 3, 2), (0, 0, 5)], [2])  # slot 0's decode first, then slots 1 and 2
    assert schedule("sarathi-serve", 8, requests, 3)[0] == ([(0, 0, 5), (1, 0, 3)], [])  # oldest first


def test_llama_server_counts_decodes_in_n_batch():
    strategy = make_strategy("llama-server", 3)
    strategy.slots = 4  # at most the budget: 3
    strategy.reset()
    running = [decoding(i) for i in range(2)]
    # slots 2, 1, 0; the decodes in slot order, then one prompt token: what is left of n_batch
    assert layout(strategy.next_step([seq(2, 5)], running)) == ([(2, 0, 1)], [1, 0])


def test_llama_server_does_not_put_a_prompt_in_progress_before_a_new_one_in_a_lower_slot():
    strategy = make_strategy("llama-server", 4)
    strategy.slots = 2
    strategy.reset()
    old = seq(0, 10)
    assert layout(strategy.next_step([old], [])) == ([(0, 0, 4)], [])  # slot 1
    old.n_prefilled = 4
    assert layout(strategy.next_step([old, seq(1, 10)], [])) == ([(1, 0, 4)], [])  # slot 0 goes first


def test_llama_server_reuses_the_slot_freed_longest_ago_once_no_fresh_slot_is_left():
    strategy = make_strategy("llama-server", 64)
    strategy.slots = 3
    strategy.reset()
    a, b, c = seq(0, 4, n_gen=1), seq(1, 4, n_gen=1), seq(2, 4)
    strategy.next_step([a, b, c], [])  # slots 2, 1, 0
    assert [strategy.slot_of[i] for i in range(3)] == [2, 1, 0]
    for s in (a, b):  # both finish in that step; post_decode frees slot 1 before slot 2
        s.n_prefilled, s.generated = 4, [5]
    c.n_prefilled, c.generated = 4, [5]
    new1, new2 = seq(3, 6), seq(4, 6)
    step = strategy.next_step([new1, new2], [c])
    assert strategy.slot_of[3] == 1 and strategy.slot_of[4] == 2  # the older release (slot 1) first
    assert layout(step) == ([(3, 0, 6), (4, 0, 6)], [2])


def test_llama_server_takes_a_fresh_slot_before_a_freed_one():
    strategy = make_strategy("llama-server", 64)
    strategy.slots = 3
    strategy.reset()
    a = seq(0, 4, n_gen=1)
    strategy.next_step([a], [])  # slot 2
    a.n_prefilled, a.generated = 4, [5]
    strategy.next_step([seq(1, 4)], [])
    assert strategy.slot_of[1] == 1  # slot 1 was never used: older than slot 2's release


def test_llama_server_takes_its_slot_count_from_the_engines_cap():
    strategy = make_strategy("llama-server", 16)
    engine.run(FakeBackend(), strategy, [Request(tuple(range(4)), 2)] * 5, 3)
    assert strategy.n_slots == 3


def test_llama_server_takes_no_more_slots_than_its_budget_and_the_rest_wait_in_arrival_order():
    # llama.cpp aborts with -np above -b, so the preset launches min(cap, budget) slots: 6 requests in flight at
    # budget 4 get 4 slots, no step holds more than 4 sequences, and the 5th and 6th start only as slots are
    # released, the 5th first.
    strategy = make_strategy("llama-server", 4)
    backend = FakeBackend()
    engine.run(backend, strategy, [Request(tuple(range(2)), 3)] * 6, 6)
    assert strategy.n_slots == 4
    held = [{c.seq_id for c in s.prefills} | {d.seq_id for d in s.decodes} for s in backend.steps]
    assert max(map(len, held)) == 4 and set().union(*held) == set(range(6))
    first = {i: next(k for k, h in enumerate(held) if i in h) for i in range(6)}
    last = {i: max(k for k, h in enumerate(held) if i in h) for i in range(6)}
    assert first[4] > min(last[i] for i in range(4)) and first[4] <= first[5]


def test_llama_server_keeps_the_slot_of_a_sequence_hidden_in_a_pipelined_step():
    strategy = make_strategy("llama-server", 16)
    strategy.slots = 2
    strategy.reset()
    a, b = seq(0, 4), seq(1, 4)
    strategy.next_step([a, b], [])
    a.n_prefilled = b.n_prefilled = 4
    a.generated = [5]
    strategy.next_step([], [a])  # b is in a step in flight: out of sight, not finished
    assert strategy.slot_of[1] == 0


# ---------------------------------------------------------------- vLLM's own steps


def vllm_processes() -> list[str]:
    return session_processes(lambda args: "vllm" in args.lower() or "VLLM::" in args)


def test_vllm_v1_on_the_sim_runs_every_step_a_real_vllm_ran(tmp_path):
    from benchmarks.server.vllm_steps import compare, make_trace, sim_steps

    trace = make_trace(seed=1, rounds=6)
    result, starts = compare(trace, budget=64, max_num_seqs=8, workdir=tmp_path)
    assert not result.differing(), result.summary(starts)
    vllm = result.vllm
    assert len(vllm) >= 60 and len(starts) == 6 and starts == sorted(starts)
    assert sum(1 for a, b in zip(vllm, vllm[1:]) if a.ctx_tokens and b.ctx_tokens) >= 5  # prompts split across steps
    assert any(s.ctx_tokens and s.gen_tokens for s in vllm)  # prompt chunks beside decodes
    assert max(s.ctx_tokens + s.gen_tokens for s in vllm) == 64  # the budget filled, never passed
    # the comparison can tell schedules apart: Orca's whole prompts are not vLLM's steps
    assert sim_steps(trace, starts, 64, 8, "orca")[0] != vllm
    assert not vllm_processes()


def test_vllm_v1_preempts_where_a_real_vllm_with_a_small_cache_preempts(tmp_path):
    """vLLM launched with 20 KV blocks of 32 tokens (--num-gpu-blocks-override, its own knob for testing preemption)
    and the sim's KV memory as big: every step equal, recomputed prompts included (vLLM's log counts them as
    generation), and vLLM's own vllm:num_preemptions_total equal to the preemptions prefillbench's engine carried
    out. Without the memory rules the sim would preempt nothing and admit the prompts vLLM held back."""
    from benchmarks.server.vllm_steps import compare, make_trace, sim_steps

    trace = make_trace(seed=1, rounds=12)
    result, starts = compare(trace, budget=64, max_num_seqs=8, workdir=tmp_path, num_gpu_blocks=20)
    assert not result.differing(), result.summary(starts)
    # How many preemptions a launch makes depends on the steps its rounds land at, which a loaded machine moves (5-7
    # alone, 2 with the suite and two helpers beside it): the proof is that they happen and are the same on both sides
    assert len(result.vllm) >= 300 and result.vllm_preemptions >= 1
    assert result.sim_preemptions == result.vllm_preemptions
    assert any(s.gen_tokens > s.gen_requests for s in result.vllm)  # a recompute, counted as generation
    unbounded, none = sim_steps(trace, starts, 64, 8)
    assert none == 0 and unbounded != result.vllm
    assert not vllm_processes()


def test_vllm_v1_with_prefix_caching_finds_what_a_real_vllm_finds_preempts_and_evicts_as_it_does(tmp_path):
    """vLLM with prefix caching on (20 KV blocks of 32 tokens) and prompts that share prefixes (a system prompt,
    sessions' later turns): every step equal, vLLM's vllm:prefix_cache_queries / _hits (first lookups) and
    vllm:num_preemptions_total equal to the engine's block cache's (engine/block_cache.py), with evictions and
    preempted requests finding their own blocks again among them. A cache that copied each prefix (no sharing) or
    kept no freed blocks would compute other chunks."""
    from benchmarks.server.vllm_steps import compare, make_trace, sim_counts, sim_record

    trace = make_trace(seed=1, rounds=14, max_prompt=200, shared=True)
    result, starts = compare(trace, budget=64, max_num_seqs=8, workdir=tmp_path, num_gpu_blocks=20,
                             prefix_caching=True)
    assert not result.differing(), result.summary(starts)
    # 6 and 7 in two launches alone, 4 loaded (where the rounds land moves with the load): that they happen, equal
    assert len(result.vllm) >= 300 and result.vllm_preemptions >= 1
    assert result.sim_preemptions == result.vllm_preemptions
    assert result.vllm_prefix == result.sim_prefix and result.vllm_prefix[1] >= 0.3 * result.vllm_prefix[0]
    cache = result.sim_cache
    assert cache.evicted_blocks > 0 and cache.preempted_hits > 0  # resumed requests found their own blocks again
    # without the cache the same arrivals make other steps
    assert sim_counts(sim_record(trace, starts, 64, 8, num_gpu_blocks=20)) != result.vllm
    assert not vllm_processes()


def test_llama_server_on_the_sim_runs_every_step_a_real_llama_server_ran(tmp_path):
    from benchmarks.server.llama_steps import differing, make_trace, run_server, sim_layouts

    run = run_server(make_trace(seed=1, n=16, rate=6.0), slots=4, budget=32, workdir=tmp_path)
    server = [s.key() for s in run.steps]
    assert not differing(server, sim_layouts(run, 32, 4))
    assert len(server) >= 60 and sum(1 for chunks, _ in server if len(chunks) > 1) >= 3  # several prompts a step
    # slot order is what sarathi-serve (oldest prompt first) gets wrong
    assert differing(server, sim_layouts(run, 32, 4, "sarathi-serve"))
    assert not session_processes(lambda args: args.split(" ")[0].endswith("llama-server"))


def test_the_spec_replay_feeds_the_engine_vllms_tokens_and_its_drafts_take_the_budget():
    """The engine half of vllm_spec_steps, on made-up 'vLLM' tokens (a model that repeats the token 7 back, now and
    then another): every token the engine keeps is the replayed one, the n-gram proposer finds drafts in them, and
    the steps never pass the budget with the drafts counted."""
    import random

    from benchmarks.server.vllm_spec_steps import ReplayBackend, make_trace
    from benchmarks.server.vllm_steps import sim_counts, sim_runs

    trace = make_trace(3, 8)
    reqs = [r for rnd in trace for r in rnd.requests]
    rng = random.Random(1)
    outputs = []
    for r in reqs:
        tokens = list(r.prompt)
        for _ in range(r.n_gen + 3):
            tokens.append(tokens[-7] if rng.random() < 0.8 else rng.randrange(3, 1000))
        outputs.append((len(r.prompt), tokens[len(r.prompt):]))
    starts = [sum(rnd.run_steps for rnd in trace[:i]) for i in range(len(trace))]
    record = sim_runs([rnd.requests for rnd in trace], starts, 64, 8, "vllm-v1 · spec ngram:3",
                      backend_factory=lambda: ReplayBackend.replaying(outputs))
    assert [list(r.tokens) for r in record.requests] == [out[:r.n_gen] for (_, out), r in zip(outputs, reqs)]
    drafted, accepted = sum(r.drafted for r in record.requests), sum(r.accepted for r in record.requests)
    assert 0 < accepted < drafted
    counts = sim_counts(record)
    assert max(s.ctx_tokens + s.gen_tokens for s in counts) == 64
    assert sum(s.gen_tokens - s.gen_requests for s in counts) == drafted  # every draft scheduled is counted


def test_vllm_v1_with_ngram_drafts_runs_every_step_a_real_vllm_with_drafts_ran(tmp_path):
    """vLLM launched with --speculative-config ngram (K=3, prompt lookup 2..4) on repetitive prompts: every step's
    scheduled tokens, drafts included, equal the engine's with the same drafts (vllm_spec_steps: the engine replays
    vLLM's tokens, its own n-gram proposer and acceptance), and vLLM's spec_decode counters equal the engine's."""
    from benchmarks.server.vllm_spec_steps import SPEC_COUNTERS, compare, make_trace

    trace = make_trace(seed=3, rounds=26)  # 24 rounds ran 297 steps, all equal (docs/speculative-decoding.md)
    result, starts = compare(trace, budget=64, max_num_seqs=8, k=3, workdir=tmp_path)
    assert result.equal, result.summary(starts)
    vllm = result.steps.vllm
    assert len(vllm) >= 300 and result.tails_agree
    assert 0 < result.vllm[SPEC_COUNTERS[2]] < result.vllm[SPEC_COUNTERS[1]]  # some drafts kept, some not
    assert sum(s.gen_tokens - s.gen_requests for s in vllm) == result.vllm[SPEC_COUNTERS[1]]  # drafts in the budget
    assert max(s.ctx_tokens + s.gen_tokens for s in vllm) == 64
    assert not vllm_processes()
