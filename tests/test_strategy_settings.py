"""Settings of an engine's scheduler given with its strategy (-s vllm-v1:threshold=512:partial=2:long-partial=1):
parsed once (strategies.split_spec), refused in one line where a strategy has no such setting, launched on the
engines that take them (vLLM's --long-prefill-token-threshold), and V0's partial-prefill limits on the sim."""
from __future__ import annotations

import json

import pytest

from prefillbench.backends.server.engines import VLLM
from prefillbench.errors import BackendError
from prefillbench.sequence import Sequence
from strategies import make_strategy, split_spec

QUIET = ["--no-progress", "--no-results-file"]


def test_a_spec_is_a_name_and_whole_number_settings():
    assert split_spec("vllm-v1") == ("vllm-v1", {})
    assert split_spec("vllm-v1:threshold=512:partial=2") == ("vllm-v1", {"threshold": 512, "partial": 2})
    strategy = make_strategy("vllm-v1:threshold=512:partial=4:long-partial=1", 2048)
    assert (strategy.long_prefill_token_threshold, strategy.max_num_partial_prefills,
            strategy.max_long_partial_prefills) == (512, 4, 1)
    for bad, why in [("vllm-v1:threshold", "is not a setting"), ("vllm-v1:threshold=-1", "is not a setting"),
                     ("vllm-v1:budget=5", "has no setting 'budget'"), ("chunked:threshold=5", "it takes none"),
                     ("vllm-v1:long-partial=1", "needs :threshold"),
                     ("vllm-v1:threshold=8:partial=1:long-partial=2", "cannot exceed partial")]:
        with pytest.raises(ValueError, match=why):
            make_strategy(bad)


@pytest.mark.parametrize("spec", ["vllm-v1:speed=2", "orca:threshold=3"])
def test_the_command_line_refuses_a_setting_a_strategy_has_not_in_one_line(run_cli, spec):
    code, out, err = run_cli("run", "--backend", "sim", "-s", spec, "--pg", "16,4", "-p", "0", "-n", "0", *QUIET)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "has no setting" in err


def test_vllm_is_launched_with_the_threshold_and_refuses_what_v1_has_not():
    values = {"model": "m", "port": 1, "budget": 2048, "slots": 8}
    argv = VLLM.argv("vllm-v1:threshold=512", values)
    assert argv[argv.index("--long-prefill-token-threshold") + 1] == "512"
    assert "--long-prefill-token-threshold" not in VLLM.argv("vllm-v1", values)
    assert not VLLM.expresses("vllm-v1:partial=2")  # V0's: vLLM 0.32 has no max_num_partial_prefills
    with pytest.raises(BackendError, match="of vllm-v1's settings it takes threshold"):
        VLLM.argv("vllm-v1:partial=2", values)


def waiting(*lengths: int) -> list[Sequence]:
    return [Sequence(i, tuple(range(n)), 4, 0.0) for i, n in enumerate(lengths)]


def test_v0_partial_limits_let_short_prompts_pass_a_long_one_and_share_the_budget():
    # a long prompt first, then three short ones; at most 3 prompts at once and 1 long: the long one starts, two
    # short ones beside it, each prompt a third of the budget
    strategy = make_strategy("vllm-v1:threshold=100:partial=3:long-partial=1", 96)
    step = strategy.next_step(waiting(500, 20, 40, 30), [])
    assert [(c.seq_id, len(c.tokens)) for c in step.prefills] == [(0, 32), (1, 20), (2, 32)]
    # a long one in progress: the next long one waits, the short one behind it goes
    queue = waiting(500, 600, 10)
    queue[0].n_prefilled = 64
    step = strategy.next_step(queue, [])
    assert [c.seq_id for c in step.prefills] == [0, 2]
    # V1 (no limits): FCFS, the long prompt takes the threshold, the short ones behind it what is left
    step = make_strategy("vllm-v1:threshold=50", 96).next_step(waiting(500, 20, 40, 30), [])
    assert [(c.seq_id, len(c.tokens)) for c in step.prefills] == [(0, 50), (1, 20), (2, 26)]


def test_a_setting_names_its_row(run_cli, tmp_path):
    export = tmp_path / "s.json"
    code, out, err = run_cli("run", "--backend", "sim", "-s", "vllm-v1,vllm-v1:threshold=64", "--chunk-size", "256",
                             "--pg", "600,8", "-p", "0", "-n", "0", "-c", "4", "-r", "1", *QUIET, "--export",
                             str(export))
    assert code == 0, err
    rows = json.loads(export.read_text())["results"]
    assert [r["strategy"] for r in rows] == ["vllm-v1", "vllm-v1:threshold=64"]
    assert "vllm-v1:threshold=64 (256)" in out
    assert rows[0]["ttft_p50_ms"] != rows[1]["ttft_p50_ms"]  # four prompts at once, 64 tokens each a step


def test_tune_searches_vllm_v1s_head_of_line_settings_beside_the_budgets():
    from prefillbench.commands.options import TuneOptions
    from prefillbench.commands.options.tune import VLLM_VARIANTS

    options = TuneOptions.from_flags(backend="sim", pg=[(512, 32)], slo="tbt=100", chunk_size=[512, 2048])
    searched = {(c.strategy, c.budget) for c in options.configs}
    for variant in VLLM_VARIANTS:
        assert {(variant, 512), (variant, 2048)} <= searched
    named = TuneOptions.from_flags(backend="sim", pg=[(512, 32)], slo="tbt=100", strategy=["vllm-v1"],
                                   chunk_size=[512])
    assert [(c.strategy, c.budget) for c in named.configs] == [("vllm-v1", 512)]  # -s names exactly what is searched
