"""Collective times (all-reduce, send/recv, and from them all-gather and all-to-all) by message size, topology and
worker count, fitted to Vidur's measured NCCL profiles.

Source: microsoft/vidur at main 7d47513 (profiles.VIDUR_COMMIT), data/profiling/network/<node>/{all_reduce,
send_recv}.csv for the nodes a100_dgx, a100_pairwise_nvlink, h100_dgx, h100_pairwise_nvlink (and a40_pairwise_nvlink's
send_recv): torch.distributed on NCCL, fp16 buffers, each row the median of the NCCL kernels' device time (kineto,
vidur/profiling/collectives/collectives_wrapper.py). `size` is in BYTES: the wrapper records `self._size * 2  #
bytes` of a buffer of `size` fp16 elements, Vidur's predictor reads it back as "each token is of size 2 * h bytes",
and as elements the DGX A100's send/recv of its largest size would stream 456 GB/s, past NVLink's 300 per
direction (as bytes: 228). The shipped sample (data/vidur_network.csv) keeps, per (node, collective, workers, devices
per node), the median of the rows' medians at about three sizes an octave (SIZE_STEPS), 2 KiB to 64 MiB (to 512
MiB in a100_pairwise_nvlink's all-reduce).

Topologies: "nvlink_dgx" (all GPUs in one NVSwitch node: a100_dgx / h100_dgx with devices_per_node = workers),
"pairwise_nvlink" (PCIe nodes whose GPUs are NVLink-bridged in pairs: at 4 workers the ring crosses PCIe),
"cross_node" (devices_per_node < workers on a DGX: a100_dgx's all-reduces over 2 nodes, the DGXs' 1-per-node
send/recv), "cross_node_pairwise" (1-per-node send/recv between two of the PCIe servers). Vidur's
h100_pairwise_nvlink/send_recv.csv is byte for byte a100_pairwise_nvlink's (a copy, not an H100 measurement):
sample_frame keeps the first of identical files (NODES order) and drops the copy.

The curve is NCCL's alpha-beta: latency + factor·bytes / bus_bw, factor the share of the message a ring moves over
each GPU's link (NCCL's bus bandwidth convention, nccl-tests doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather
and all-to-all (n-1)/n (bytes: the gathered output, the per-GPU all-to-all buffer), send/recv 1. Where one line
misses the FIT sizes by more than 15% at the small or large end, a second line is fitted: the time is the lower
of the two where NCCL's tuner picks the faster protocol (LL for small messages, Simple/ring for large ones, a
latency and a bandwidth each), the higher where past a size a slower path binds (the PCIe servers' cross-node
send/recv: 7 GB/s to 4 MB, 2.5 GB/s beyond). Fit and test: per curve, alternate sizes (even positions in the
sorted sizes) fit and the others test. All-gather and all-to-all are not measured: they are the all-reduce curve of
the same topology and workers with their byte factor and its latencies, and their source says so (where NCCL
runs the all-reduce as something other than a ring, as NVLS reduces inside an H100 node's NVSwitch, the shared bus
bandwidth is an approximation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from prefillbench.backends.sim.measured import profiles, store
from prefillbench.backends.sim.measured.profiles import VIDUR_COMMIT, VIDUR_REPO
from prefillbench.backends.sim.specs import SimConfigError

VIDUR_NETWORK = "data/profiling/network"
DATA_DIR = Path(__file__).resolve().parent / "data"
SAMPLE = DATA_DIR / "vidur_network.csv"
NODES = ("a100_dgx", "a100_pairwise_nvlink", "h100_dgx", "h100_pairwise_nvlink", "a40_pairwise_nvlink")
MEASURED = ("all_reduce", "send_recv")
KINDS = ("all_reduce", "send_recv", "all_gather", "all_to_all")
TOPOLOGIES = ("nvlink_dgx", "pairwise_nvlink", "cross_node", "cross_node_pairwise")
#: Sizes kept per curve: the measured size nearest each of 2 KiB x 2^(k/SIZE_STEPS).
SIZE_STEPS = 3
#: One alpha-beta line is kept unless it misses a FIT size at either end by more than this (the brief's 15%).
TWO_REGIME_AT = 0.15
#: Of the GPUs profiled, which to take when none is named (the newest that has the topology).
GPU_ORDER = ("h100", "a100", "a40")
SAMPLE_COLUMNS = ("node", "collective", "num_workers", "devices_per_node", "size", "median_ms", "std_ms")


def byte_factor(kind: str, workers: int) -> float:
    """Share of the message a ring moves over each GPU's link: NCCL's bus bandwidth factor."""
    n = workers
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "all_to_all"):
        return (n - 1) / n
    if kind == "send_recv":
        return 1.0
    raise SimConfigError(f"unknown collective {kind!r}: one of {', '.join(KINDS)}")


@dataclass(frozen=True)
class CollectiveCurve:
    """latency + factor·bytes / bus_bw (alpha-beta), per topology and worker count; with a second line that binds
    at small messages (small_latency_s, small_bus_bw), the lower (combine "min") or higher ("max") of the two."""

    topology: str
    workers: int
    latency_s: float
    bus_bw: float  # bytes/s over each GPU's link, NCCL's bus bandwidth
    source: str
    kind: str = "all_reduce"
    gpu: str = ""  # profile fitted on: h100 | a100 | a40
    factor: float = 1.0  # byte_factor(kind, workers)
    small_latency_s: float = 0.0  # the line that binds at small messages (small_bus_bw 0: none)
    small_bus_bw: float = 0.0
    combine: str = "min"  # two lines: the lower (NCCL picks the faster protocol) or "max" (a slower path binds)

    def seconds(self, nbytes: float):
        n = np.asarray(nbytes, dtype=float)
        if self.workers <= 1:
            return _out(np.zeros_like(n))
        t = self.latency_s + self.factor * n / self.bus_bw
        if self.small_bus_bw:
            join = np.minimum if self.combine == "min" else np.maximum
            t = join(t, self.small_latency_s + self.factor * n / self.small_bus_bw)
        return _out(t)


def _out(x):
    x = np.asarray(x, dtype=float)
    return x if x.ndim else float(x)


def topology_of(node: str, workers, devices_per_node):
    w, d = np.asarray(workers), np.asarray(devices_per_node)
    dgx = node.endswith("_dgx")
    return np.where(d < w, "cross_node" if dgx else "cross_node_pairwise", "nvlink_dgx" if dgx else "pairwise_nvlink")


# ---- Vidur's files and the shipped sample -----------------------------------------------------------------------
def _size_subset(sizes: np.ndarray, steps: int = SIZE_STEPS) -> np.ndarray:
    sizes = np.unique(sizes)
    lo, hi = math.log2(sizes.min()), math.log2(sizes.max())
    targets = 2.0 ** np.arange(lo, hi + 1e-9, 1.0 / steps)
    pick = {int(sizes[np.argmin(np.abs(np.log2(sizes) - math.log2(t)))]) for t in targets}
    return np.array(sorted(pick | {int(sizes.max())}))


def sample_frame(frames: dict[tuple[str, str], pd.DataFrame], subset: bool = True) -> pd.DataFrame:
    """What the shipped sample keeps of Vidur's network files ((node, collective) -> its csv read whole): per node,
    collective, workers, devices per node and size (bytes), the median over repeated rows of the median and std
    (ms); at _size_subset's sizes when `subset`. A file identical to one before it (NODES order) is a copy: dropped."""
    parts, seen = [], []
    order = {n: i for i, n in enumerate(NODES)}
    for (node, coll), raw in sorted(frames.items(), key=lambda kv: (order.get(kv[0][0], len(NODES)), kv[0])):
        if any(c == coll and raw.equals(other) for c, other in seen):
            continue
        seen.append((coll, raw))
        med, std = f"time_stats.{coll}.median", f"time_stats.{coll}.std"
        missing = [c for c in ("num_workers", "devices_per_node", "size", med) if c not in raw.columns]
        if missing:
            raise SimConfigError(f"{node}/{coll}.csv has no {', '.join(missing)}: not a Vidur network profile")
        g = raw.groupby(["num_workers", "devices_per_node", "size"], as_index=False).agg(
            median_ms=(med, "median"), std_ms=(std, "median"))
        if subset:
            g = pd.concat([c[c["size"].isin(_size_subset(c["size"].to_numpy()))]
                           for _, c in g.groupby(["num_workers", "devices_per_node"])])
        g.insert(0, "collective", coll)
        g.insert(0, "node", node)
        parts.append(g)
    if not parts:
        raise SimConfigError("no Vidur network profiles to sample")
    df = pd.concat(parts, ignore_index=True)
    df["median_ms"] = df["median_ms"].round(6)
    df["std_ms"] = df["std_ms"].map(lambda x: float(f"{x:.2g}"))
    for c in ("num_workers", "devices_per_node", "size"):
        df[c] = df[c].astype(int)
    return df[list(SAMPLE_COLUMNS)].sort_values(list(SAMPLE_COLUMNS[:5]), kind="stable").reset_index(drop=True)


def vidur_files(root: str | Path) -> dict[tuple[str, str], Path]:
    """(node, collective) -> its csv under a Vidur checkout (or its data/profiling/network folder)."""
    root = Path(root)
    for base in (root / VIDUR_NETWORK, root):
        found = {(n, c): base / n / f"{c}.csv" for n in NODES for c in MEASURED if (base / n / f"{c}.csv").is_file()}
        if found:
            return found
    raise SimConfigError(f"no Vidur network profile under {root}: expected {VIDUR_NETWORK}/<node>/all_reduce.csv "
                         f"({VIDUR_REPO} at {VIDUR_COMMIT[:7]})")


def read_vidur(root: str | Path, subset: bool = True) -> pd.DataFrame:
    return sample_frame({k: pd.read_csv(p) for k, p in vidur_files(root).items()}, subset)


SAMPLE_HEADER = (f"# {VIDUR_REPO}@{VIDUR_COMMIT} {VIDUR_NETWORK}/<node>/<collective>.csv: median over repeated rows "
                 "of the median and std (ms) per (node, collective, workers, devices per node, size); size in bytes "
                 "(the wrapper's size * 2), about 3 sizes an octave; made by python -m benchmarks.sim."
                 "make_attn_net_samples\n")


def write_sample(df: pd.DataFrame, path: str | Path = SAMPLE) -> None:
    profiles.write_csv(df, path, SAMPLE_HEADER)


def read_sample(path: str | Path = SAMPLE) -> pd.DataFrame:
    return profiles.read_csv(path)


def frame(sample: pd.DataFrame) -> pd.DataFrame:
    """The sample with gpu, topology, nbytes, median_s, std_s and split (fit | test: alternate sizes per curve)."""
    df = sample.copy()
    df["gpu"] = df["node"].str.split("_").str[0]
    df["topology"] = "nvlink_dgx"
    for node, idx in df.groupby("node").groups.items():
        df.loc[idx, "topology"] = topology_of(node, df.loc[idx, "num_workers"], df.loc[idx, "devices_per_node"])
    df["nbytes"] = df["size"].astype(float)
    df["median_s"] = df["median_ms"] * 1e-3
    df["std_s"] = df["std_ms"] * 1e-3
    pos = df.sort_values("size").groupby(["node", "collective", "num_workers", "devices_per_node"]).cumcount()
    df["split"] = np.where(pos.reindex(df.index) % 2 == 0, "fit", "test")
    return df


@lru_cache(maxsize=None)
def _sample_frame() -> pd.DataFrame:
    return frame(read_sample())


def load_frame(path: str | Path | None = None) -> pd.DataFrame:
    """frame() of the shipped sample (None) or of a Vidur checkout at `path` (every size). A copy."""
    return _sample_frame().copy() if path is None else frame(read_vidur(path, subset=False))


# ---- fitting --------------------------------------------------------------------------------------------------------
def noise(df: pd.DataFrame) -> float:
    """The measurements' own relative spread: the median of std / median (each row's std over its timed runs)."""
    rel = (df["std_s"] / df["median_s"]).to_numpy()
    return float(np.median(rel[np.isfinite(rel)]))


#: Robust losses tried on log time beyond the data's spread (scipy least_squares): soft-L1 weighs a far point like
#: its distance, Cauchy like its log, so that where a size's median sits at one of two levels from row to row (small
#: messages: 7 or 30 us) Cauchy follows one level where soft-L1 lands between them. The lower FIT median wins.
LOSSES = ("soft_l1", "cauchy")


def _line(n, t, factor, scale, x0, loss):
    """(latency_s, bus_bw) through (bytes, seconds), least squares on log time under `loss` beyond `scale`."""
    def residual(x):
        return np.log((x[0] * 1e-6 + factor * n / (x[1] * 1e9)) / t)
    r = least_squares(residual, x0, bounds=([0.0, 1e-3], [1e4, 1e4]), loss=loss, f_scale=scale, x_scale="jac")
    return r.x[0] * 1e-6, r.x[1] * 1e9


def _two_lines(n, t, factor, scale, combine, loss):
    """(small-size line, large-size line) as ((latency, bus_bw), (latency, bus_bw)) of two lines through (bytes,
    seconds) joined by `combine` (np.minimum or np.maximum), started from a line on each side of every quarter of
    the sizes; the best start (least cost) is kept. Under a max the large-size line's latency is an intercept and
    may be negative: the small-size line binds where it would matter."""
    def curve(x):
        return combine(x[0] * 1e-6 + factor * n / (x[1] * 1e9), x[2] * 1e-6 + factor * n / (x[3] * 1e9))

    lo_lat = 0.0 if combine is np.minimum else -1e5
    best = None
    for k in (len(n) // 4, len(n) // 2, 3 * len(n) // 4):
        lo = _line(n[:k], t[:k], factor, scale, [t[0] * 1e6, 10.0], loss)
        hi = _line(n[k:], t[k:], factor, scale, [t[k] * 1e6, factor * n[-1] / t[-1] * 1e-9], loss)
        x0 = [lo[0] * 1e6, lo[1] * 1e-9, hi[0] * 1e6, hi[1] * 1e-9]
        r = least_squares(lambda x: np.log(np.maximum(curve(x), 1e-12) / t), x0,
                          bounds=([0.0, 1e-3, lo_lat, 1e-3], [1e4, 1e4, 1e4, 1e4]), loss=loss, f_scale=scale,
                          x_scale="jac")
        if best is None or r.cost < best.cost:
            best = r
    x = best.x
    first, second = (x[0] * 1e-6, x[1] * 1e9), (x[2] * 1e-6, x[3] * 1e9)
    # The small-size line binds at the smallest size: under a min the lower, under a max the higher latency.
    small_first = (first[0] <= second[0]) == (combine is np.minimum)
    return (first, second) if small_first else (second, first)


def fit_curve(df: pd.DataFrame, kind: str, gpu: str, topology: str, workers: int) -> CollectiveCurve:
    """The curve through df's rows (one node, collective, workers; give it the FIT sizes). One alpha-beta line, or
    two where the line misses the smallest or largest quarter or half of the sizes by more than TWO_REGIME_AT
    (median |error| over it: a systematic miss, not one noisy size) and two lines fit the sizes better. Two lines
    join as the lower of them (NCCL's LL protocol below its Simple/ring one: the small line of lower latency and
    bandwidth) or as the higher (past a size a slower path binds: a lower bandwidth for large messages, as the
    PCIe servers' cross-node send/recv shows); either must cross inside the sizes. Each form is fitted under each
    of LOSSES; what is kept is the lowest median |error| on these (FIT) sizes."""
    n, t = df["nbytes"].to_numpy(), df["median_s"].to_numpy()
    order = np.argsort(n)
    n, t = n[order], t[order]
    factor = byte_factor(kind, workers)
    scale = max(noise(df), 0.01)
    q4, q2 = max(2, len(n) // 4), max(2, len(n) // 2)

    def med(pred):
        return float(np.median(np.abs(pred / t - 1.0)))

    lines = [_line(n, t, factor, scale, [t[0] * 1e6, factor * n[-1] / t[-1] * 1e-9], loss) for loss in LOSSES]
    lat, bw = min(lines, key=lambda x: med(x[0] + factor * n / x[1]))
    err = np.abs((lat + factor * n / bw) / t - 1.0)
    ends = max(np.median(err[:q4]), np.median(err[-q4:]), np.median(err[:q2]), np.median(err[-q2:]))
    where = (f"{VIDUR_REPO}@{VIDUR_COMMIT[:7]} {VIDUR_NETWORK}/{df['node'].iloc[0]}/{kind}.csv, workers {workers}, "
             f"{int(df['devices_per_node'].iloc[0])} per node, {len(n)} FIT sizes {int(n[0])}-{int(n[-1])} B "
             "(alternate sizes; the others test)")
    best, best_err = None, float(np.median(err))
    if ends > TWO_REGIME_AT:
        for (combine, name) in ((np.minimum, "min"), (np.maximum, "max")):
            for loss in LOSSES:
                (a1, b1), (a2, b2) = _two_lines(n, t, factor, scale, combine, loss)
                cross = (a2 - a1) / (factor / b1 - factor / b2) if b1 != b2 else -1.0
                e = med(combine(a1 + factor * n / b1, a2 + factor * n / b2))
                if n[0] < cross < n[-1] and e < best_err:
                    best, best_err = (a1, b1, a2, b2, name, cross), e
    if best:
        a1, b1, a2, b2, name, cross = best
        how = "the lower" if name == "min" else "the higher"
        source = (f"two alpha-beta lines, {how} of them (one line missed an end of the FIT sizes by {ends:.0%} "
                  f"median; they cross at {cross / 1024:.0f} KiB), fitted to {where}")
        return CollectiveCurve(topology, workers, a2, b2, source, kind, gpu, factor, a1, b1, name)
    return CollectiveCurve(topology, workers, lat, bw, f"alpha-beta fitted to {where}", kind, gpu, factor)


@lru_cache(maxsize=None)
def _fit_groups() -> dict[tuple[str, str, str, int], pd.DataFrame]:
    """(gpu, kind, topology, workers) -> the shipped sample's FIT rows of that curve (a later node of the same key
    replaces an earlier one, in groupby's order)."""
    df = _sample_frame()
    out = {}
    keys = ["gpu", "collective", "topology", "num_workers", "node", "devices_per_node"]
    for (gpu, kind, topo, workers, _node, _dpn), g in df[df["split"] == "fit"].groupby(keys):
        out[(gpu, kind, topo, int(workers))] = g
    return out


@lru_cache(maxsize=None)
def fitted_curve(gpu: str, kind: str, topology: str, workers: int) -> CollectiveCurve:
    """One curve fitted on its FIT sizes, when first asked for: fitting all of them (about 500 least-squares
    solves) was most of a short TP > 1 run's CPU."""
    return fit_curve(_fit_groups()[(gpu, kind, topology, workers)], kind, gpu, topology, workers)


def fitted_curves() -> dict[tuple[str, str, str, int], CollectiveCurve]:
    """(gpu, kind, topology, workers) -> the curve fitted on the shipped sample's FIT sizes, for every measured one."""
    return {key: fitted_curve(*key) for key in _fit_groups()}


@lru_cache(maxsize=1)
def shipped_curves() -> dict[tuple[str, str, str, int], CollectiveCurve]:
    """fitted_curves() as they were when data/fitted_curves.json was written (store.py: why shipped)."""
    return {(g, k, t, int(w)): CollectiveCurve(**r["curve"]) for r in store.section("collectives")
            for g, k, t, w in [r["key"]]}


def collective(kind: str, workers: int, topology: str, gpu: str | None = None) -> CollectiveCurve:
    """The curve of `kind` among `workers` GPUs over `topology`, from `gpu`'s profile (None: the newest profiled one
    with that topology, GPU_ORDER). All-gather and all-to-all are the all-reduce curve with their byte factor; a
    worker count not measured takes the nearest measured one's latency and bandwidth with its own factor."""
    if kind not in KINDS:
        raise SimConfigError(f"unknown collective {kind!r}: one of {', '.join(KINDS)}")
    if topology not in TOPOLOGIES:
        raise SimConfigError(f"unknown topology {topology!r}: one of {', '.join(TOPOLOGIES)}")
    if workers <= 1:
        return CollectiveCurve(topology, workers, 0.0, math.inf, "one worker: no collective", kind, gpu or "", 0.0)
    measured = "send_recv" if kind == "send_recv" else "all_reduce"
    curves = shipped_curves()
    have = {(g, w) for g, k, tp, w in curves if k == measured and tp == topology}
    gpus = [g for g in ((gpu,) if gpu else GPU_ORDER) if any(h == g for h, _ in have)]
    if not gpus:
        raise SimConfigError(f"no {measured} profile over {topology}" + (f" for {gpu}" if gpu else "") +
                             f": profiled are {sorted(have)}")
    g = gpus[0]
    ws = sorted(w for h, w in have if h == g)
    w = min(ws, key=lambda x: (abs(math.log(x / workers)), -x))  # nearest in ratio; a tie takes the larger
    base = curves[(g, measured, topology, w)]
    source = base.source
    if kind != measured:
        source = (f"{kind} not measured: the {measured} curve's latency and bus bandwidth with the ring's byte factor "
                  f"{byte_factor(kind, workers):.3g} in place of {byte_factor(measured, w):.3g}; {source}")
    if w != workers:
        source = f"{workers} workers not measured over {topology}: {w} workers' latency and bus bandwidth; {source}"
    return replace(base, workers=workers, kind=kind, factor=byte_factor(kind, workers), source=source)


# ---- checking -------------------------------------------------------------------------------------------------------
#: The sim's spec-sheet links before these curves (presets.GPU_PRESETS: A100-SXM 300 / 25 GB/s, H100-SXM 450 / 50
#: GB/s, NVLink per direction / network per GPU), cost.py _link's network_fraction 0.8 and collective_latency_s 10 us.
FLAT_LINKS = {"a100": (300e9, 25e9), "h100": (450e9, 50e9)}


def flat_seconds(df: pd.DataFrame, network_fraction: float = 0.8, latency_s: float = 10e-6) -> np.ndarray:
    """cost.py's price: factor·bytes / (link·0.8) + 10 us, the link NVLink (interconnect_bw) within a node and the
    network (network_bw) across; NaN for a GPU without a preset (a40)."""
    out = np.full(len(df), np.nan)
    for i, r in enumerate(df.itertuples(index=False)):
        if r.gpu in FLAT_LINKS:
            link = FLAT_LINKS[r.gpu][1 if r.topology == "cross_node" else 0]
            out[i] = byte_factor(r.collective, r.num_workers) * r.nbytes / (link * network_fraction) + latency_s
    return out


def errors(df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each row with the fitted curve's pred_s, the flat price flat_s and their relative errors."""
    df = load_frame() if df is None else df.copy()
    curves = fitted_curves()
    pred = np.empty(len(df))
    for i, r in enumerate(df.itertuples(index=False)):
        pred[i] = curves[(r.gpu, r.collective, r.topology, int(r.num_workers))].seconds(r.nbytes)
    df["pred_s"] = pred
    df["flat_s"] = flat_seconds(df)
    df["err"] = df["pred_s"] / df["median_s"] - 1.0
    df["flat_err"] = df["flat_s"] / df["median_s"] - 1.0
    return df


def spread(df: pd.DataFrame) -> pd.Series:
    """The data's own spread about a smooth curve, with no model: each TEST size's error when it is read off the FIT
    sizes on either side of it (straight line in log time over log size); the smallest and largest TEST sizes, with
    a FIT size on one side only, are left out. Indexed like df's TEST rows that have one."""
    parts = []
    for _, g in df.groupby(["node", "collective", "num_workers", "devices_per_node"]):
        fit, test = g[g["split"] == "fit"], g[g["split"] == "test"]
        fit = fit.sort_values("nbytes")
        test = test[(test["nbytes"] > fit["nbytes"].min()) & (test["nbytes"] < fit["nbytes"].max())]
        read = np.exp(np.interp(np.log(test["nbytes"]), np.log(fit["nbytes"]), np.log(fit["median_s"])))
        parts.append(pd.Series(read / test["median_s"].to_numpy() - 1.0, index=test.index))
    return pd.concat(parts) if parts else pd.Series(dtype=float)


def summary(err: pd.DataFrame) -> pd.DataFrame:
    """Per curve and split: points, median and worst |error| of the curve and of the flat price, the rows' own std
    (noise) and, on TEST rows, the neighbour read-off's median and worst |error| (spread)."""
    rows = []
    sp = spread(err).abs()
    keys = ["gpu", "collective", "topology", "num_workers", "split"]
    for (gpu, kind, topo, w, split), g in err.groupby(keys, sort=True):
        s = sp.reindex(g.index).dropna()
        rows.append({"gpu": gpu, "collective": kind, "topology": topo, "workers": int(w), "split": split,
                     "points": len(g), "median_err": float(np.median(np.abs(g["err"]))),
                     "worst_err": float(np.max(np.abs(g["err"]))),
                     "flat_median_err": float(np.median(np.abs(g["flat_err"]))),
                     "flat_worst_err": float(np.max(np.abs(g["flat_err"]))), "noise": noise(g),
                     "spread_median": float(s.median()) if len(s) else np.nan,
                     "spread_worst": float(s.max()) if len(s) else np.nan})
    return pd.DataFrame(rows)


__all__ = ["CollectiveCurve", "KINDS", "SAMPLE", "TOPOLOGIES", "byte_factor", "collective", "errors", "fit_curve",
           "fitted_curve", "fitted_curves", "flat_seconds", "shipped_curves", "frame", "load_frame", "read_sample", "read_vidur", "sample_frame",
           "spread", "summary", "topology_of", "write_sample"]
