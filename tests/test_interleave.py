"""run --interleave: strategies measured in turns, so drift cancels out of their ratios."""
from __future__ import annotations

from prefillbench import cli
from prefillbench.backends.fake import FakeBackend
from prefillbench.bench import interleave
from prefillbench.bench.cases import BenchConfig, run_case
from prefillbench.report.compare import relative_frame
from prefillbench.bench.metrics import results_frame
from prefillbench.bench.workloads import TestSpec
from strategies import STRATEGIES


class DriftingBackend(FakeBackend):
    """Slows down a little with every step, like a machine another job is moving onto."""

    def __init__(self, drift: float = 0.005):
        super().__init__(seconds_per_token=0.001, seconds_per_step=0.01)
        self.drift = drift

    def execute(self, step, return_logits=False):
        self.per_step *= 1 + self.drift
        return super().execute(step, return_logits)


def config(**kw) -> BenchConfig:
    base = dict(tests=[TestSpec(64, 8)], strategies=["sequential", "padded", "chunked"], concurrency=[1, 2],
                chunk_sizes=[16], repetitions=4)
    base.update(kw)
    return BenchConfig(**base)


def test_groups_and_abba_order():
    groups = config().case_groups()
    assert [[(c.strategy, c.concurrency) for c in g] for g in groups] == [
        [("sequential", 1), ("padded", 1), ("chunked", 1)], [("sequential", 2), ("padded", 2), ("chunked", 2)]]
    assert [interleave.turn_order(3, r) for r in range(3)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]


def test_same_rows_as_case_by_case_on_a_steady_machine():
    cfg = config()
    a = [run_case(FakeBackend(), case, cfg).row for case in cfg.cases()]
    b = [r.row for r in interleave.run_interleaved(FakeBackend(), cfg)]
    key = lambda r: (r.test, r.concurrency, r.strategy, r.chunk_size or 0)  # noqa: E731
    a, b = sorted(a, key=key), sorted(b, key=key)
    assert [key(r) + (r.repetitions,) for r in a] == [key(r) + (r.repetitions,) for r in b]
    for x, y in zip(a, b):
        assert abs(x.throughput - y.throughput) < 1e-6 * x.throughput


def test_interleaving_cancels_drift_out_of_ratios():
    # At concurrency 1, padded does exactly sequential's work: the true ratio is 1.
    cfg = config(concurrency=[1], strategies=["sequential", "padded"])
    by_case = [run_case(backend, case, cfg).row for backend in [DriftingBackend()] for case in cfg.cases()]
    turns = [r.row for r in interleave.run_interleaved(DriftingBackend(), cfg)]
    err_by_case = abs(relative_frame(results_frame(by_case), "sequential", ["throughput"])["throughput"][1] - 1)
    err_turns = abs(relative_frame(results_frame(turns), "sequential", ["throughput"])["throughput"][1] - 1)
    assert err_by_case > 0.05  # the drift is visible...
    assert err_turns < err_by_case / 10  # ...and mostly gone when the strategies take turns


def test_cli_flag(capsys):
    code = cli.main(["run", "--backend", "fake", "-p", "0", "-n", "0", "--pg", "32,4", "-c", "2", "-r", "2",
                     "--interleave", "--no-progress", "--no-results-file", "--relative-to", "sequential"])
    out = capsys.readouterr().out
    assert code == 0
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert len(table) == 2 + sum(not c.needs_price for c in STRATEGIES.values())  # every strategy but slo-budget (--slo)
    assert "Verdict against sequential" in out  # and the verdict under the table
