"""Calibration files: fitted attainable fractions and per-step overhead for one model on one device."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .specs import SimConfigError

FITTED_KEYS = ("compute_fraction", "memory_fraction", "step_overhead_s")


def load_calibration(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise SimConfigError(f"cannot read calibration {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise SimConfigError(f"calibration {path} is not JSON: {e}") from None
    fitted = data.get("fitted") if isinstance(data, dict) else None
    if not isinstance(fitted, dict) or any(k not in fitted for k in FITTED_KEYS):
        raise SimConfigError(f"calibration {path} has no fitted {', '.join(FITTED_KEYS)}")
    return data
