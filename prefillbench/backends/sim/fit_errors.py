"""How far a fit's prices land from the steps they were fitted to: one place for the spec and the measured forms of
a calibration (both modules import it; it imports neither)."""
from __future__ import annotations

import numpy as np


def error_stats(errors: list[float]) -> dict[str, float]:
    """The median and 90th percentile of |error| over a fit's steps, as a calibration file holds them."""
    abs_err = np.abs(np.asarray(errors, dtype=float))
    return {"median_abs_error": float(np.median(abs_err)), "p90_abs_error": float(np.percentile(abs_err, 90))}


__all__ = ["error_stats"]
