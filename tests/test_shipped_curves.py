"""The sim prices with curves shipped as numbers (measured/store.py says why): they must be what a fit made here
from the shipped samples gives, to the fit's own tolerance, on any BLAS (this module runs again at the lower ISA)."""
from __future__ import annotations

import math

import numpy as np

from prefillbench.backends.sim.measured import attention, collectives, linear, profiles, refit, store

#: least_squares' default ftol: it stops once a step changes the cost (0.5·Σr², r the log errors) by under ftol of
#: it, so a stop sits within about ftol·cost of the optimum's cost, and its log predictions within
#: sqrt(2·ftol·cost) = sqrt(ftol)·||r|| of the optimum's. Two stops (the file's, one made on another BLAS) are within
#: twice that of each other.
FTOL = 1e-8


def _bound(log_errors: np.ndarray) -> float:
    return 2.0 * math.sqrt(FTOL) * float(np.linalg.norm(log_errors))


def _assert_close(shipped_s, refit_s, measured_s, what: str):
    shipped_s, refit_s = np.asarray(shipped_s, float), np.asarray(refit_s, float)
    apart = float(np.max(np.abs(np.log(refit_s / shipped_s))))
    bound = _bound(np.log(shipped_s / np.asarray(measured_s, float)))
    assert apart <= bound, f"{what}: a fit made here prices its FIT rows {apart:.3g} (log) from the file's, past {bound:.3g}"


def test_the_file_holds_every_curve_a_fit_makes_with_its_sources():
    shipped, now = refit.numbers(store.section_tree()), refit.numbers(refit.sections())
    assert shipped.keys() == now.keys()
    assert {k: v for k, v in shipped.items() if not isinstance(v, float)} == \
        {k: v for k, v in now.items() if not isinstance(v, float)}


def test_each_shipped_linear_curve_prices_its_fit_rows_as_a_fit_made_here():
    for gpu, peaks in linear.PEAKS.items():
        rows = [r for r in profiles.load_rows(gpu) if r.fit]
        (gemm, elementwise), (gemm_now, elementwise_now) = linear.shipped_curves(gpu), linear.fitted_curves(gpu)
        g = [r for r in rows if r.is_gemm]
        flops, nbytes = np.array([r.flops for r in g]), np.array([r.nbytes for r in g])
        _assert_close(gemm.seconds(flops, nbytes, peaks.flops, peaks.mem_bw),
                      gemm_now.seconds(flops, nbytes, peaks.flops, peaks.mem_bw), [r.median_s for r in g],
                      f"{gpu} GEMM")
        for c in elementwise_now.classes:
            e = [r for r in rows if not r.is_gemm and r.op_class == c.op_class]
            nbytes, row = np.array([r.nbytes for r in e]), np.array([r.row_bytes for r in e])
            _assert_close(elementwise.for_class(c.op_class).seconds(nbytes, peaks.mem_bw, row_bytes=row),
                          c.seconds(nbytes, peaks.mem_bw, row_bytes=row), [r.median_s for r in e],
                          f"{gpu} {c.op_class}")


def test_the_shipped_attention_and_collective_curves_price_their_fit_rows_as_a_fit_made_here():
    df = attention.load_frame()
    fit = df[df["split"] == "fit"]
    _assert_close(attention.predict(fit, attention.shipped_attention()),
                  attention.predict(fit, attention.fitted_attention()), fit["median_s"], "attention")
    shipped = collectives.shipped_curves()
    for key, rows in collectives._fit_groups().items():
        n = rows["nbytes"].to_numpy()
        _assert_close(shipped[key].seconds(n), collectives.fitted_curve(*key).seconds(n), rows["median_s"],
                      f"collective {key}")


def test_a_run_prices_by_the_file_not_by_a_fit(monkeypatch):
    """The sim reads the file: were it to fit when a run starts, its floats would follow the BLAS again."""
    from prefillbench.backends.sim.configs import load_gpu_spec
    from prefillbench.backends.sim.pricing import MeasuredPricing

    def refuse(*_a, **_k):
        raise AssertionError("fitted at run time")

    for name in ("fit_gemm", "fit_elementwise"):
        monkeypatch.setattr(linear, name, refuse)
    monkeypatch.setattr(attention, "fit_attention", refuse)
    monkeypatch.setattr(collectives, "fit_curve", refuse)
    linear.fitted_curves.cache_clear(); attention.fitted_attention.cache_clear(); collectives.fitted_curve.cache_clear()
    try:
        p = MeasuredPricing.for_gpu(load_gpu_spec("a100-sxm"))
        assert p.linear(1e12, 1e9) > 0 and p.prefill_attention(1e12, 1e8, 4096, 1e11) > 0
        assert p.collective("all_reduce", 8e6, 4) > 0
    finally:
        linear.fitted_curves.cache_clear(); attention.fitted_attention.cache_clear()
        collectives.fitted_curve.cache_clear()
