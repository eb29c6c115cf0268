"""Each command's options as one typed, validated value, built from the parsed flags here and nowhere else:
one module per command (common: what they share).

cli.py declares the flags and hands them, by parameter name, to a `from_flags` below (hyperfine's
cli.rs / options.rs split). A `from_flags` checks what the parser cannot: values out of range,
flags that do not go together, a flag the chosen backend ignores (warned about once, naming flag
and backend, from the backends' own declarations: prefillbench.backends.check_options), repeated
list values (dropped, with a note). A bad value ends in UsageError: one line, exit 2.
"""
from __future__ import annotations

from prefillbench.commands.options.ab import (DEFAULT_MAX_ROUNDS, DEFAULT_MAX_SECONDS, DEFAULT_MIN_ROUNDS, DEFAULT_PRESET,
                                              ABOptions)
from prefillbench.commands.options.calibrate import CalibrateOptions
from prefillbench.commands.options.capacity import CapacityOptions
from prefillbench.commands.options.common import BackendOptions, Measuring, note
from prefillbench.commands.options.compare import CompareOptions, MergeOptions, PlotOptions
from prefillbench.commands.options.run import RunOptions
from prefillbench.commands.options.tune import DEFAULT_BUDGETS, DEFAULT_TOP_K, QUICK, SIM_OF_TUNE, TUNE_OUTPUTS, TuneOptions

__all__ = ["ABOptions", "BackendOptions", "CalibrateOptions", "CapacityOptions", "CompareOptions", "DEFAULT_BUDGETS",
           "DEFAULT_MAX_ROUNDS", "DEFAULT_MAX_SECONDS", "DEFAULT_MIN_ROUNDS", "DEFAULT_PRESET", "DEFAULT_TOP_K", "Measuring", "MergeOptions",
           "PlotOptions", "QUICK", "RunOptions", "SIM_OF_TUNE", "TUNE_OUTPUTS", "TuneOptions", "note"]
