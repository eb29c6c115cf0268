"""The progress bar counts work: prompt tokens and decodes, not only emitted tokens (a 512-token prefill is 512)."""
from __future__ import annotations

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.bench.cases import request_tokens
from prefillbench.bench.workloads import TestSpec, make_requests, request_lengths
from prefillbench.cli import main


def test_the_steps_report_every_prompt_token_and_decode_and_add_up_to_the_planned_total():
    backend = load_backend("sim", None)
    test = TestSpec(300, 6)
    lengths = request_lengths(test, 4, 1)
    requests = make_requests(test, 4, backend.vocab_size, 1)
    for strategy in ("sequential", "chunked", "padded"):
        counted: list[int] = []
        engine.run(backend, make_strategy(strategy, 64), requests, 2, on_tokens=counted.append)
        assert sum(counted) == request_tokens(lengths) == 4 * (300 + 5)
        assert max(counted) >= 64  # a prefill step counts its prompt tokens, not the one token it yields


def test_a_run_says_how_many_cases_and_tokens_before_it_starts(capsys):
    assert main(["run", "--backend", "sim", "-p", "128", "-n", "0", "-c", "1,2", "-s", "sequential,chunked", "-r", "2",
                 "--no-results-file", "--no-progress", "--no-verdict"]) == 0
    err = capsys.readouterr().err
    assert "4 case(s) x 2 repetition(s)" in err and "tokens to process" in err
