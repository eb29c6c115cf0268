"""The sim's attention and collective curves against Vidur's measured medians: held-out error beside the fit half's and the sim's flat pricing.

Attention (A100, FlashAttention, Llama-2-70B at TP 2): the grid's checkerboard, points whose two grid indices sum
to an even number fit and the others test; error = predicted / measured - 1. The flat price is the sim's
spec-sheet roofline before the curve, max(FLOPs / 0.8 peak, bytes / 0.85 bandwidth), on the same FLOPs and bytes.
Collectives (all-reduce and send/recv per GPU, topology and workers): alternate sizes fit, the others test; the
flat price is cost.py's link, factor x bytes / (0.8 x link) + 10 us, NVLink within a node (A100 300, H100 450 GB/s
a direction) and the network across (25 / 50 GB/s). The data's spread is what no model can beat: each held-out
point read off its FIT neighbours (the grid's two on either side, or the sizes on either side), median / worst
|error| (attention.spread, collectives.spread).

    python -m benchmarks.sim.attention_net              # the shipped samples
    python -m benchmarks.sim.attention_net --curves     # and the fitted constants
    python -m benchmarks.sim.attention_net --vidur-attention ~/src/vidur   # a checkout at e2d00e9, every point
"""
from __future__ import annotations

import argparse

import pandas as pd
from tabulate import tabulate

from prefillbench.backends.sim.measured import attention, collectives

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vidur-attention", help="test on every point of a Vidur checkout's attention.csv")
    parser.add_argument("--curves", action="store_true", help="print the fitted constants too")


def _worst(df: pd.DataFrame, column: str, label) -> str:
    row = df.loc[df[column].abs().idxmax()]
    return f"{row[column]:+.0%} ({label(row)})"


def _attention_label(row) -> str:
    if row["kind"] == "prefill":
        return f"chunk {row['prefill_chunk_size']} ctx {row['kv_cache_size']}"
    return f"batch {row['batch_size']} ctx {row['kv_cache_size']}"


def _spread(summary: pd.DataFrame, **key) -> str:
    row = summary[(summary["split"] == "test")]
    for k, v in key.items():
        row = row[row[k] == v]
    r = row.iloc[0]
    return f"{r['spread_median']:.1%} / {r['spread_worst']:.0%}"


def attention_rows(err: pd.DataFrame) -> list[list[str]]:
    out = []
    summ = attention.summary(err)
    for kind in ("prefill", "decode"):
        part = err[err["kind"] == kind]
        test, fit = part[part["split"] == "test"], part[part["split"] == "fit"]
        out.append([kind, f"{len(fit)} / {len(test)}", f"{test['err'].abs().median():.1%}",
                    _worst(test, "err", _attention_label), f"{fit['err'].abs().median():.1%}",
                    _worst(fit, "err", _attention_label), f"{test['flat_err'].abs().median():.1%}",
                    _worst(test, "flat_err", _attention_label), _spread(summ, kind=kind)])
    return out


def _size(row) -> str:
    n = row["size"]
    return f"{n / 2**20:.3g} MiB" if n >= 2**20 else f"{n / 2**10:.3g} KiB"


def collective_rows(err: pd.DataFrame) -> list[list[str]]:
    out = []
    curves = collectives.fitted_curves()
    summ = collectives.summary(err)
    for (gpu, kind, topo, w), part in err.groupby(["gpu", "collective", "topology", "num_workers"], sort=True):
        test, fit = part[part["split"] == "test"], part[part["split"] == "fit"]
        c = curves[(gpu, kind, topo, int(w))]
        form = f"2 lines ({c.combine})" if c.small_bus_bw else "1 line"
        flat = (f"{test['flat_err'].abs().median():.1%}", _worst(test, "flat_err", _size)) \
            if test["flat_err"].notna().all() else ("-", "-")
        out.append([gpu, kind, topo, int(w), form, f"{test['err'].abs().median():.1%}", _worst(test, "err", _size),
                    f"{fit['err'].abs().median():.1%}", *flat,
                    _spread(summ, gpu=gpu, collective=kind, topology=topo, workers=int(w))])
    return out


def main(args: argparse.Namespace) -> None:
    frame = attention.load_frame(args.vidur_attention) if args.vidur_attention else attention.load_frame()
    att = attention.errors(frame)
    print("Attention (A100, Vidur e2d00e9; fit / test points on the grid's checkerboard)\n")
    print(tabulate(attention_rows(att), headers=["kind", "fit / test points", "held-out median |err|",
                                                 "held-out worst", "fit median |err|", "fit worst",
                                                 "flat held-out median", "flat worst", "data spread median / worst"],
                   tablefmt="github"))
    net = collectives.errors()
    print("\nCollectives (Vidur 7d47513; alternate sizes fit, the others test)\n")
    print(tabulate(collective_rows(net), headers=["GPU", "collective", "topology", "workers", "curve",
                                                  "held-out median |err|", "held-out worst", "fit median |err|",
                                                  "flat held-out median", "flat worst",
                                                  "data spread median / worst"],
                   tablefmt="github"))
    if args.curves:
        c = attention.fitted_attention()
        print()
        print(tabulate([[c.gpu, f"{c.prefill_eff:.2f}", f"{c.prefill_half_rows:.0f}", f"{c.prefill_hill:.2f}",
                         f"{c.diag_factor:.2f}", f"{c.prefill_floor_s * 1e6:.1f}", f"{c.decode_eff:.3f}",
                         f"{c.decode_floor_s * 1e6:.1f}"]],
                       headers=["GPU", "prefill_eff", "half rows", "hill n", "diag factor", "prefill floor us",
                                "decode_eff", "decode floor us"], tablefmt="github"))
        print()
        rows = []
        for (gpu, kind, topo, w), c in sorted(collectives.fitted_curves().items()):
            small = (f"{c.small_latency_s * 1e6:.1f} us, {c.small_bus_bw / 1e9:.1f} GB/s ({c.combine})"
                     if c.small_bus_bw else "-")
            rows.append([gpu, kind, topo, w, f"{c.latency_s * 1e6:.1f}", f"{c.bus_bw / 1e9:.1f}", small])
        print(tabulate(rows, headers=["GPU", "collective", "topology", "workers", "latency us", "bus GB/s",
                                      "second line"], tablefmt="github"))


if __name__ == "__main__":
    cli.run(__name__)
