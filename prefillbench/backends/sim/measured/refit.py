"""Fits the sim's curves again from the shipped samples and writes data/fitted_curves.json (--write) or says how far
the file is from a fit made here (--check). store.py says why the curves are shipped as numbers rather than fitted
when a run starts.

    python -m prefillbench.backends.sim.measured.refit --check
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from prefillbench.backends.sim.measured import attention, collectives, linear, store


def sections() -> dict:
    """Every curve the sim prices by, fitted now: what the file holds."""
    return {"linear": {gpu: {"gemm": asdict(gemm), "elementwise": asdict(elementwise)}
                       for gpu in linear.PEAKS for gemm, elementwise in [linear.fitted_curves(gpu)]},
            "attention": asdict(attention.fitted_attention()),
            "collectives": [{"key": list(key), "curve": asdict(curve)}
                            for key, curve in sorted(collectives.fitted_curves().items())]}


def numbers(tree, path: str = "") -> dict[str, object]:
    """path -> leaf of a sections() tree, lists indexed: what --check and the test compare."""
    if isinstance(tree, dict):
        return {k: v for key in sorted(tree) for k, v in numbers(tree[key], f"{path}/{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, item in enumerate(tree) for k, v in numbers(item, f"{path}[{i}]").items()}
    return {path: tree}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite data/fitted_curves.json from a fit made here")
    ap.add_argument("--check", action="store_true", help="print the largest relative difference from the file")
    args = ap.parse_args(argv)
    fitted = sections()
    if args.write:
        store.FILE.write_text(store.dumps(fitted))
        print(f"wrote {store.FILE}")
    if args.check or not args.write:
        shipped, now = numbers(store.section_tree()), numbers(fitted)
        if shipped.keys() != now.keys():
            print(f"the file and the fit hold different curves: {sorted(shipped.keys() ^ now.keys())[:5]}")
            return 1
        worst = max(((abs(now[k] / shipped[k] - 1.0) if shipped[k] else abs(now[k]), k)
                     for k in now if isinstance(now[k], float) and now[k] != shipped[k]), default=(0.0, "none"))
        texts = [k for k in now if not isinstance(now[k], float) and now[k] != shipped[k]]
        print(f"largest relative difference from the file: {worst[0]:.3g} ({worst[1]}); other fields differing: "
              f"{len(texts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
