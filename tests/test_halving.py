"""Successive halving's short round (bench/halving.py): how many requests its probes replay."""
from __future__ import annotations

import pytest

from prefillbench.bench import capacity, halving
from prefillbench.bench.tune import TuneSettings
from prefillbench.bench.workloads import TestSpec


@pytest.mark.parametrize("full, short", [(1000, 250), (4000, 1000), (300, 250), (40, 40)])
def test_the_short_round_replays_a_quarter_but_never_fewer_than_250_nor_more_than_the_full_round(full, short):
    settings = TuneSettings(TestSpec(1730, 415), [capacity.Criteria(tbt_p99_ms=100.0)], full, repeats=3, precision=0.05)
    got = halving.short_settings(settings)
    assert got.requests == short and got.repeats == 1 and got.precision == 0.1
