"""SGLang's radix cache (prefillbench/engine/radix_cache.py) and the `sglang` strategies reading it
(strategies/sglang_radix.py): the tree's own rules, by hand and against SGLang 0.5.23's RadixCache driven with the same
operations; then, through SGLang's scheduler with the radix cache on (benchmarks/engine/sglang_reference.py,
`make sglang`'s environment), LPM's order and every iteration of the seeded session presets equal."""
from __future__ import annotations

import dataclasses
import json
import random
import subprocess

import pytest

from benchmarks.engine.sglang_sessions import RADIX_PRESETS, random_radix_cases
from benchmarks.engine.sglang_steps import ROOT, Comparison, Config, TraceRequest, compare, strategy_iterations
from prefillbench.backends.server import sglang_env
from prefillbench.engine.radix_cache import OutOfSlots, RadixCache, RequestKV

# ---------------------------------------------------------------- the tree, by hand


def test_a_match_ending_inside_a_node_splits_it_and_counts_only_the_shared_tokens():
    c = RadixCache(100)
    assert c.insert((1, 2, 3, 4)) == 0 and c.evictable_size == 4
    assert c.insert((1, 2, 3, 4, 5)) == 4 and c.evictable_size == 5  # only the new token is new
    n, node = c.match_prefix((1, 2, 9))
    assert n == 2 and node.key == (1, 2) and node.parent is c.root
    assert [child.key for child in node.children.values()] == [(3, 4)]  # the rest hangs below the split
    assert c.match_prefix((1, 2, 3, 4, 5, 6), limit=3)[0] == 3  # a limit caps the lookup (never the last token)
    assert c.match_prefix((7, 8))[0] == 0


def test_a_locked_path_is_protected_and_an_unlocked_one_evictable():
    c = RadixCache(100)
    c.insert((1, 2, 3, 4))
    c.insert((1, 2, 5, 6))
    _, node = c.match_prefix((1, 2, 3, 4))
    c.inc_lock_ref(node)
    assert (c.protected_size, c.evictable_size) == (4, 2)  # (1, 2) and (3, 4) locked; (5, 6) not
    c.inc_lock_ref(node)
    c.dec_lock_ref(node)
    assert (c.protected_size, c.evictable_size) == (4, 2)  # still one lock
    c.available = 0
    assert c.evict(100) == 2 and c.available == 2  # only the unlocked leaf goes
    c.dec_lock_ref(node)
    assert (c.protected_size, c.evictable_size) == (0, 4)
    assert c.evict(100) == 4 and c.evictable_size == 0 and not c.root.children


def test_eviction_takes_the_least_recently_used_leaf_first_and_a_parent_once_childless():
    c = RadixCache(100)
    c.insert((1, 2, 3))  # a: (1,) then (2, 3) after the next insert splits it
    c.insert((1, 4, 5))  # b
    c.insert((6, 7))  # c
    c.match_prefix((1, 2, 3))  # a touched last: it goes after b and c
    c.available = 0
    assert c.evict(1) == 2 and c.match_prefix((1, 4, 5))[0] == 1  # b's leaf (4, 5): a whole node, 2 tokens
    assert c.evict(1) == 2 and c.match_prefix((6, 7))[0] == 0  # then c
    assert c.evict(1) == 2 and c.match_prefix((1, 2, 3))[0] == 1  # then a's leaf; (1,) is a leaf now
    assert c.evict(1) == 1 and not c.root.children and c.stats.evicted_blocks == 7


def test_allocation_evicts_only_what_the_free_slots_fall_short_of():
    c = RadixCache(10)
    c.insert((1, 2, 3, 4))
    c.insert((5, 6, 7, 8))
    c.available = 2
    c.alloc(2)
    assert c.evictable_size == 8  # enough was free: nothing evicted
    c.alloc(3)  # 3 short: one leaf of 4 goes
    assert c.evictable_size == 4 and c.available == 1
    with pytest.raises(OutOfSlots):
        c.alloc(6)


class Seq:
    """The parts of a Sequence the cache reads."""

    def __init__(self, seq_id: int, prompt: tuple[int, ...], generated=()) -> None:
        self.seq_id, self.prompt, self.generated, self.earlier = seq_id, prompt, list(generated), 0

    @property
    def request_prompt_len(self) -> int:
        return len(self.prompt) - self.earlier


def test_a_checkpoint_frees_the_slots_of_a_prefix_another_request_put_there_first():
    """Two requests prefilling the same 6-token prompt in one batch each hold 6 slots; the first checkpoint puts its
    tokens in the tree, the second finds them there and frees its own copies (RadixCache._insert_cache)."""
    c = RadixCache(20)
    a, b = RequestKV(Seq(0, (1, 2, 3, 4, 5, 6))), RequestKV(Seq(1, (1, 2, 3, 4, 5, 6)))
    c.alloc(12)
    a.committed = b.committed = 6
    c.checkpoint(a, 6)
    assert c.available == 8 and c.protected_size == 6
    c.checkpoint(b, 6)
    assert c.available == 14 and c.protected_size == 6 and a.lock is b.lock
    c.reqs = {0: a, 1: b}
    assert c.release(0, checkpoint=False) and c.protected_size == 6  # b still holds the prefix
    assert c.release(1, checkpoint=False) and (c.protected_size, c.evictable_size, c.available) == (0, 6, 14)


def test_a_finished_request_is_split_at_its_prompt_so_its_output_goes_first():
    c = RadixCache(20)
    rec = c.request(Seq(0, (1, 2, 3, 4), generated=[7, 7, 7]))
    c.alloc(6)
    rec.committed = 6  # the prompt and two outputs computed (the last token never is)
    c.release(0, checkpoint=True)
    assert c.available == 14 and c.evictable_size == 6
    c.available = 0
    assert c.evict(1) == 2 and c.match_prefix((1, 2, 3, 4, 7, 7))[0] == 4  # the output first, the prompt kept


# ---------------------------------------------------------------- the tree, against SGLang's own

DRIVER = """
import json, sys
from array import array
from types import SimpleNamespace
from sglang.test.test_utils import maybe_stub_sgl_kernel
maybe_stub_sgl_kernel()
from sglang.srt.mem_cache import radix_cache as m
from benchmarks.engine.sglang_reference import Ticks
m.time = Ticks(m.time)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
allocator = SimpleNamespace(device="cpu", free_segment=lambda v, start_pos: None)

def left(tree):
    paths, stack = [], [(tree.root_node, [])]
    while stack:  # what is left: every node's tokens from the root, sorted
        node, above = stack.pop()
        for child in node.children.values():
            path = above + list(child.key.token_ids)
            paths.append(path)
            stack.append((child, path))
    return sorted(paths)

answers = []
for ops in json.loads(sys.stdin.read()):
    tree = m.RadixCache.create_simulated(mock_allocator=allocator)
    locks, out = [], []
    answers.append(out)
    for op, arg in ops:
        if op == "insert":
            out.append(tree.insert(InsertParams(key=m.RadixKey(array("q", arg)))).prefix_len)
        elif op == "match":
            r = tree.match_prefix(MatchPrefixParams(key=m.RadixKey(array("q", arg))))
            locks.append(r.last_device_node)
            out.append(r.device_prefix_len)
        elif op == "lock":
            tree.inc_lock_ref(locks[arg])
        elif op == "unlock":
            tree.dec_lock_ref(locks[arg])
        else:
            out.append(tree.evict(EvictParams(num_tokens=arg)).num_tokens_evicted)
            out.append(left(tree))
        out.append([tree.evictable_size(), tree.protected_size()])
print(json.dumps(answers))
"""


def random_ops(seed: int, n: int) -> list:
    """Inserts and lookups of token runs that share prefixes (a few stems, branching), half the lookups' nodes locked
    at once and unlocked later (never more unlocks than locks), evictions of a few tokens."""
    rng = random.Random(seed)
    stems = [tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 12))) for _ in range(6)]
    ops, matched, locked = [], 0, []
    for _ in range(n):
        tokens = list(rng.choice(stems)[:rng.randint(0, 12)]) + [rng.randint(1, 9) for _ in range(rng.randint(0, 6))]
        r = rng.random()
        if r < 0.35:
            ops.append(("insert", tokens))
        elif r < 0.6:
            ops.append(("match", tokens))
            matched += 1
            if rng.random() < 0.5:  # locked at once, as a scheduler locks what it matched (a node may go before)
                ops.append(("lock", matched - 1))
                locked.append(matched - 1)
        elif r < 0.75 and locked:
            ops.append(("unlock", locked.pop(rng.randrange(len(locked)))))
        else:
            ops.append(("evict", rng.randint(1, 8)))
    return ops


def ours(ops: list) -> list:
    c = RadixCache(1 << 20)
    nodes, out = [], []
    for op, arg in ops:
        if op == "insert":
            out.append(c.insert(tuple(arg)))
        elif op == "match":
            n, node = c.match_prefix(tuple(arg))
            nodes.append(node)
            out.append(n)
        elif op == "lock":
            c.inc_lock_ref(nodes[arg])
        elif op == "unlock":
            c.dec_lock_ref(nodes[arg])
        else:
            out.append(c.evict(arg))
            paths, stack = [], [(c.root, [])]
            while stack:
                node, above = stack.pop()
                for child in node.children.values():
                    path = above + list(child.key)
                    paths.append(path)
                    stack.append((child, path))
            out.append(sorted(paths))
        out.append([c.evictable_size, c.protected_size])
    return out


@pytest.fixture(scope="module")
def installed():
    sglang_env.install()


def test_the_tree_answers_as_sglangs_radix_cache_over_random_operations(installed):
    """600 random operations, three seeds: every insert's shared length, lookup's length, eviction's freed tokens and
    what is left in the tree after it (every node, its tokens from the root), and the evictable and protected sizes
    after each operation equal SGLang 0.5.23's RadixCache's (its clock the same counter)."""
    runs = [random_ops(seed, 600) for seed in (1, 2, 3)]
    done = subprocess.run([str(sglang_env.installed_python()), "-W", "ignore", "-c", DRIVER],
                          input=json.dumps(runs), capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for ops, theirs in zip(runs, answers, strict=True):
        assert ours(ops) == theirs
        assert sum(1 for op, _ in ops if op == "evict") > 20 and any(x for x in theirs if isinstance(x, int) and x)


# ---------------------------------------------------------------- the strategies against SGLang's scheduler


def test_lpm_admits_the_request_with_the_longest_cached_prefix_first(installed):
    """Request 0 (200 tokens, one output) leaves its prompt in the tree. At iteration 1 three arrive in id order: a
    300-token prompt, a 50-token one and one that starts with request 0's prompt. LPM puts the last first: it starts
    past its 200 cached tokens (its 20 new ones charged), then the 300-token prompt is chunked to the 236 left of 256;
    with the cache off (FCFS), the 300-token prompt comes first and nothing is cached."""
    shared = tuple(range(2000, 2200))
    trace = [TraceRequest(0, 200, 1, 0, False, tokens=shared),
             TraceRequest(1, 300, 4, 1, False, tokens=tuple(range(3000, 3300))),
             TraceRequest(2, 50, 4, 1, False, tokens=tuple(range(4000, 4050))),
             TraceRequest(3, 220, 4, 1, False, tokens=shared + tuple(range(5000, 5020)))]
    on, off = Config(256, 16384, 5000, 8, False, radix_cache=True), Config(256, 16384, 5000, 8, False)
    results = compare([("lpm", trace, on), ("fcfs", trace, off)])
    lpm, fcfs = results[0].sglang, results[1].sglang
    assert lpm[1].prefill == ((3, 20), (1, 236)) and lpm[1].prefix == (200, 0)
    assert fcfs[1].prefill == ((1, 256),) and fcfs[1].prefix == (0,)
    assert all(not c.mismatches for c in results), [c.first_mismatch() for c in results]


@pytest.fixture(scope="module")
def preset_results(installed):
    return compare([(p.name, p.trace(), p.config) for p in RADIX_PRESETS])


def test_the_strategies_run_every_step_sglangs_radix_cache_runs(preset_results):
    """Every session preset (python -m benchmarks.engine.sglang_steps --radix): prompt tokens and where each starts,
    decodes, retractions, the ratio and the tokens evicted so far equal in every iteration; the caches evict, the
    prompts find cached prefixes, and one preset retracts."""
    for c in preset_results:
        assert not c.mismatches, c.first_mismatch()
        assert c.steps >= 200 and c.evicted(c.sglang) > 1000 and c.cached(c.sglang) > 1000
    assert any(c.retractions(c.sglang) for c in preset_results)
    assert any(it.kind == "mixed" for c in preset_results for it in c.sglang)


def test_the_comparison_tells_lru_from_another_eviction_order(preset_results, monkeypatch):
    """The first preset with the engine's tree evicting the most recently used leaf first: its iterations differ from
    SGLang's (so LRU, not luck, made them equal); and with the engine's cache off (the radix-off rules on the same
    trace) they differ too."""
    preset = RADIX_PRESETS[0]
    on = next(c for c in preset_results if c.name == preset.name)
    plain = RadixCache.evict

    def most_recent_first(self, num_tokens):
        for leaf in self.evictable_leaves:
            leaf.last_access = -leaf.last_access
        try:
            return plain(self, num_tokens)
        finally:
            for leaf in self.evictable_leaves:
                leaf.last_access = abs(leaf.last_access)

    monkeypatch.setattr(RadixCache, "evict", most_recent_first)
    mru = Comparison("mru", preset.config, on.sglang, strategy_iterations(preset.trace(), preset.config))
    assert mru.mismatches and mru.evicted(mru.ours) > 0
    monkeypatch.undo()
    off = dataclasses.replace(preset.config, radix_cache=False)
    assert Comparison("off", off, on.sglang, strategy_iterations(preset.trace(), off)).mismatches


def test_the_strategies_run_every_step_sglangs_radix_cache_runs_on_random_sessions(installed):
    """Thirty seeded random session cases (random_radix_cases: chunks of 4 to 256 tokens, pools from just over the
    longest conversation, one to many running, mixed or not, ignore_eos or not): every iteration equal
    (python -m benchmarks.engine.sglang_steps --radix --random 30)."""
    results = compare(random_radix_cases(0, 30))
    for c in results:
        assert not c.mismatches, c.first_mismatch()
    assert sum(c.steps for c in results) > 5000 and sum(c.evicted(c.sglang) for c in results) > 10000
