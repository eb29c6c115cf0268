"""`prefillbench calibrate`'s options."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from prefillbench.commands.options.common import BackendOptions
from prefillbench.errors import UsageError


@dataclass
class CalibrateOptions:
    load: BackendOptions
    sim_model: str | None = None  # shapes for the sim; None: the real backend's model config
    sim_gpu: str | None = None  # the nominal spec the fractions are relative to
    quick: bool = False
    repeats: int = 3
    output: str = "calibration.json"
    errors: str | None = None
    check: bool = False
    check_run: tuple[int, ...] = (192, 16, 4, 8, 64)

    @classmethod
    def from_flags(cls, **flags: Any) -> CalibrateOptions:
        # --sim-model and --sim-gpu describe the sim being fitted here, not a sim backend to load.
        backend_flags = {k: v for k, v in flags.items() if k not in ("sim_model", "sim_gpu")}
        own = {f.name for f in fields(cls)} - {"load"}
        options = cls(BackendOptions.pick(backend_flags), **{k: v for k, v in flags.items() if k in own})
        if options.repeats < 1:
            raise UsageError(f"--repeats must be at least 1, got {options.repeats}")
        if options.load.served_engine() is None:
            server = [flag for flag, v in (("--engine", options.load.engine), ("--server-cmd", options.load.server_cmd),
                                           ("--url", options.load.url), ("--server-bin", options.load.server_bin)) if v]
            if server:
                raise UsageError(f"{server[0]} is for a serving engine: calibrate --backend server (or llama-server)")
        options.load.validate()
        return options
