"""SGLang 0.5.23's own scheduling code (installed by `make sglang`, which `make test` runs first) as the reference for
the `sglang` and `sglang-mixed` strategies: the reference reproduces the behaviours that
../shared/notes/sglang-and-kv-memory.md §4 names (a long prompt's chunks back to back, NO_TOKEN closing admission
until a request leaves, the ratio's trace), every step of the seeded traces equals the strategies'
(benchmarks/engine/sglang_steps.py), and every launch line the SGLang preset can produce parses with SGLang's own
argument parser (ServerArgs.add_cli_args)."""
from __future__ import annotations

import dataclasses
import json
import math
import subprocess

import pytest

from benchmarks.engine.sglang_steps import (PRESETS, Config, Iteration, TraceRequest, compare, preset_trace,
                                            random_cases, references)
from prefillbench.backends.server import sglang_env
from prefillbench.backends.server.engines import SGLANG
from strategies import compose

#: environ.py's SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
INIT, FLOOR = 0.7, 0.7 * 0.14
DECAY = (INIT - FLOOR) / 600
#: one decay is a subtraction of two doubles below 1: its rounding is below 2**-52; far below any rule's difference
ULP = 1e-15


@pytest.fixture(scope="module", autouse=True)
def installed():
    """`make sglang`'s environment (made before the suite by `make test`; here found, or made where a test runs
    alone)."""
    sglang_env.install()


def req(i: int, prompt: int, output: int, arrival: int, ignore_eos: bool = True) -> TraceRequest:
    return TraceRequest(i, prompt, output, arrival, ignore_eos)


def prefill_of(it: Iteration, rid: int) -> int:
    return dict(it.prefill).get(rid, 0)


# ---------------------------------------------------------------- the reference: SGLang's golden behaviours


def golden_runs():
    """Three small traces, one run of SGLang's code: a long prompt beside a decode, prefill first and mixed; and a
    prompt that does not fit its memory estimate beside two running requests."""
    long_prompt = [req(0, 20, 60, 0), req(1, 1024, 4, 5)]
    no_token = [req(0, 100, 2000, 0, False), req(1, 200, 40, 0, False), req(2, 989, 300, 3, False)]
    return references([(long_prompt, Config(256, 16384, 100_000, 8, False)),
                       (long_prompt, Config(256, 16384, 100_000, 8, True)),
                       (no_token, Config(512, 16384, 3000, 8, False))])


@pytest.fixture(scope="module")
def golden():
    return golden_runs()


def test_a_long_prompt_runs_its_chunks_back_to_back_and_every_decode_waits(golden):
    """Golden 1 (scheduler.py get_next_batch_to_run, "Run prefill first if possible"; PrefillAdder.add_chunked_req):
    a prompt of N = 1024 tokens at chunked_prefill_size C = 256 is ceil(N/C) = 4 prefill iterations in a row, each
    the prompt alone, the running request decoding in none of them; mixed, the budget is C less the one running
    decode: ceil(1024/255) = 5 mixed iterations, the decode in every one."""
    plain, mixed = golden[0], golden[1]
    chunks = [(i, it) for i, it in enumerate(plain) if prefill_of(it, 1)]
    assert [prefill_of(it, 1) for _, it in chunks] == [256, 256, 256, 256]
    assert [i for i, _ in chunks] == list(range(chunks[0][0], chunks[0][0] + 4))  # back to back
    assert all(it.kind == "extend" and not it.decode for _, it in chunks)  # request 0 made no token meanwhile
    assert plain[chunks[0][0] - 1].decode == (0,) and plain[chunks[-1][0] + 1].decode == (0, 1)
    chunks = [it for it in mixed if prefill_of(it, 1)]
    assert [prefill_of(it, 1) for it in chunks] == [255, 255, 255, 255, 4]
    assert all(it.kind == "mixed" and it.decode == (0,) for it in chunks)


def test_no_token_closes_admission_until_a_request_leaves(golden):
    """Golden 2 (_get_new_batch_prefill_raw: NO_TOKEN sets running_batch.batch_is_full; only a batch that shrinks
    clears it). Requests 0 and 1 prefill together (budget 512); request 2 arrives at iteration 3 needing
    989 + 300 + 1 = 1290 tokens (PrefillBudget.check_prefill), and beside the two running requests (304 tokens held,
    0.698 x 2034 expected) 3000 leave 1276: NO_TOKEN. Each pure decode then frees more of the estimate than it takes
    (the ratio's decay on request 0's 2000-token output): from iteration 13 the budget alone would take it (1290.4).
    The flag keeps it out all the same until request 1 finishes after its 40th token, and it starts in the very
    iteration after that."""
    run = golden[2]
    first = next(i for i, it in enumerate(run) if prefill_of(it, 2))
    last_of_1 = max(i for i, it in enumerate(run) if 1 in it.decode)
    assert first == last_of_1 + 1 == 40
    assert all(it.kind == "decode" for it in run[3:first])
    assert [1 in it.decode for it in run[2:last_of_1 + 1]] == [True] * (last_of_1 - 1)  # 1 decoded throughout


def test_the_ratio_decays_on_pure_decodes_floors_and_is_reset_only_when_idle(golden):
    """Golden 3 (NewTokenRatioTracker: decay_step per update_running_batch without retraction, the floor
    init x 0.14, the estimate after retract_decode, reset in on_idle when fully idle): 0.7 falling (0.7 - 0.098)/600
    a pure decode step to 0.098, unchanged by prefill and mixed iterations, set (not decayed) after a retraction,
    0.7 again only after an idle iteration."""
    preset = next(p for p in PRESETS if p.name == "retract")
    run = references([(preset_trace(preset), preset.config)])[0]
    ratios, prev, retractions = [], INIT, 0
    for it in run:
        if it.kind == "idle":
            prev = INIT  # fully idle: reset (checked on the next iteration that runs)
            continue
        if it.retracted:
            retractions += 1
            assert abs(it.ratio - max(prev - DECAY, FLOOR)) > 1e-6  # re-estimated, not one more decay
        elif it.kind == "decode":
            assert math.isclose(it.ratio, max(prev - DECAY, FLOOR), abs_tol=ULP), it
        else:
            assert it.ratio == prev, it
        ratios.append(it.ratio)
        prev = it.ratio
    assert ratios[0] == INIT and min(ratios) == pytest.approx(FLOOR, abs=ULP) and retractions >= 1
    ended = golden[0]  # every request done: the idle iteration after the last decode resets it (Scheduler.on_idle)
    assert ended[-2].kind == "decode" and ended[-2].ratio < INIT and ended[-1].kind == "idle" and ended[-1].ratio == INIT


# ---------------------------------------------------------------- the strategies against it, step for step


def test_the_strategies_run_every_step_sglangs_code_runs():
    """Every preset trace (>= 200 scheduler iterations each; two with retractions, ignore_eos off in a small
    cache; one with ignore_eos in a small cache, where admission is add_one_req_ignore_eos's simulation): the prompt
    tokens of each request, the decodes, the retractions and the ratio equal in every iteration
    (benchmarks/engine/sglang_steps.py)."""
    results = compare([(p.name, preset_trace(p), p.config) for p in PRESETS])
    for c in results:
        assert not c.mismatches, c.first_mismatch()
        assert c.steps >= 200
    retracting = [c for c in results if c.retractions(c.sglang)]
    assert len(retracting) >= 1 and all(c.retractions(c.ours) == c.retractions(c.sglang) for c in results)
    assert any(it.kind == "mixed" for c in results for it in c.sglang)
    # the comparison tells schedules apart: the default launch's steps are not the mixed one's
    plain = next(c for c in results if c.name == "default")
    mixed = compare([("contrast", preset_trace(PRESETS[0]), Config(256, 16384, 200_000, 16, True))])[0]
    assert mixed.sglang != plain.sglang
    # --prefill-decode-interval (the decode-rounds cadence, strategies/cadence.py): the presets that set it defer
    # prompts for its rounds after a batch with prompts while requests wait, and the comparison sees it
    for c in results:
        config = next(p.config for p in PRESETS if p.name == c.name)
        deferred = sum(1 for a, b in zip(c.sglang, c.sglang[1:]) if a.kind in ("extend", "mixed") and b.kind == "decode")
        if config.prefill_decode_interval:
            assert deferred >= 20, c.name
    paced = next(p for p in PRESETS if p.name == "decode-rounds")
    unpaced = compare([("every", preset_trace(paced), dataclasses.replace(paced.config, prefill_decode_interval=0))])
    assert unpaced[0].sglang != next(c for c in results if c.name == "decode-rounds").sglang


def test_the_decode_rounds_cadence_runs_every_step_sglangs_code_runs_on_random_cases():
    """Thirty seeded random configurations and traces (random_cases: chunks of a few tokens to 256, caches of a few
    hundred tokens, ignore_eos on and off, mixed and not), each with a --prefill-decode-interval of 1-8 and a min-bs of
    1-4: every iteration equal (python -m benchmarks.engine.sglang_steps --random 30 --decode-rounds 1)."""
    results = compare(random_cases(0, 30, decode_rounds=True))
    for c in results:
        assert not c.mismatches, c.first_mismatch()
    assert sum(c.steps for c in results) > 1000


# ---------------------------------------------------------------- the preset, against SGLang's own parser

PARSER = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
out = {"flags": sorted(o for a in parser._actions for o in a.option_strings), "errors": []}
for argv in json.loads(sys.stdin.read()):
    try:
        parser.parse_args(argv)
    except SystemExit:
        out["errors"].append(argv)
print(json.dumps(out))
"""


def launch_lines() -> list[list[str]]:
    """Every launch the preset makes: each strategy, with and without a budget and its settings, cache on and off
    (the program's words, `python -m sglang.launch_server`, left off: the parser takes what follows them)."""
    values = {"model": "org/model", "port": 30000, "slots": 64, "budget": 2048}
    lines = []
    for name in SGLANG.strategies:
        for spec in (name, f"{name}:max-prefill=8192:ignore-eos=1"):
            for budget in (2048, None):
                for cache in (False, True):
                    argv = SGLANG.argv(spec, {**values, "budget": budget}, cache=cache)
                    lines.append(argv[argv.index("--model-path"):])
        for cadence in ("decode-rounds:4", "decode-rounds:16:min-bs=8"):  # the cadence it ships (cadence.py)
            argv = SGLANG.argv(compose(name, "fixed", cadence), values)
            lines.append(argv[argv.index("--model-path"):])
    return lines


def test_every_launch_line_of_the_preset_parses_with_sglangs_own_parser():
    lines = launch_lines()
    done = subprocess.run([str(sglang_env.installed_python()), "-W", "ignore", "-c", PARSER],
                          input=json.dumps(lines), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {w for line in lines for w in line if w.startswith("--")}
    assert {"--chunked-prefill-size", "--enable-mixed-chunk", "--disable-radix-cache",
            "--max-prefill-tokens", "--prefill-decode-interval", "--prefill-decode-interval-min-bs"} <= ours
    assert sorted(ours - set(out["flags"])) == [] and out["errors"] == []
    assert len(lines) == 20
