"""Attention kernel time, prefill and decode, fitted to Vidur's measured FlashAttention profile on an A100.

Source: microsoft/vidur at e2d00e9 (ATTENTION_COMMIT; the file is gone from later commits),
data/profiling/a100/attention.csv: sarathi-serve's FlashAttention wrapper (flash_attn_with_kvcache on a paged cache
of 16-token blocks, fp16) timed by the PyTorch profiler (ProfileMethod.KINETO: device time, no launch) for one layer
of Llama-2-70B at TP 2: 32 query heads and 4 KV heads of 128 on the GPU. Prefill is one sequence, a chunk of 64 to
4,096 tokens after 0 to 4,032 cached ones (chunk + cache <= 4,096); decode is 1 to 128 sequences of one token each
over 32 to 4,032 cached positions. The shipped sample (data/vidur_a100_attention.csv) keeps the median of each
grid point below (PREFILL_CHUNKS x PREFILL_CONTEXTS, DECODE_BATCHES x DECODE_CONTEXTS) and its std.

FLOPs and bytes are the sim's (cost.py shape_terms), per GPU: a chunk of L tokens after s cached ones is
4·hd·heads·(L·s + L(L+1)/2) FLOPs (causal: each query attends what precedes it and itself) and moves its Q in and O
out, the K and V of its s + L positions, and its own new K and V; a decode step of B sequences over contexts c_i
(each including itself) is 4·hd·heads·sum(c_i) FLOPs and moves sum(c_i) positions of K and V plus its Q, O and new
K/V rows. Decode attention is bandwidth-bound, prefill attention compute-bound.

What the profile shows, and so what the curve is:
- Prefill: at a fixed chunk the time grows linearly with the cached context, at a rate per key that rises with the
  chunk (111 TFLOP/s of the context's FLOPs at 256 tokens, 163 at 1,024, 222 at 3,072: 36% -> 71% of the 312 peak),
  while the chunk attending itself (the causal diagonal block) costs 3-4x as much per FLOP at every chunk (a
  chunk with no context: 30 TFLOP/s at 512 tokens, 59 at 4,096). The rise is occupancy: FlashAttention runs a
  thread block per (head, 128 query rows), so 32 heads x 256 tokens is 64 blocks on the A100's 108 SMs. The
  curve's compute rate is therefore prefill_eff·peak·r^n / (r^n + r_half^n), r = query rows (heads x query tokens
  of the launch), a Hill rise to prefill_eff; diagonal FLOPs count diag_factor times.
  prefill_eff, the share of peak a long chunk reaches, is FlashAttention-2's published forward rate: "up to 230
  TFLOPs/s, 73% of the theoretical maximum TFLOPs/s on A100 GPUs" (Dao, arXiv 2307.08691, sec. 4; its abstract
  "50-73%"; its Fig. 5 plots the forward rate rising with sequence length). FlashAttention-3 (Shah et al., arXiv
  2407.08608) reaches "up to 740 TFLOPs/s (75% utilization)" in FP16 on the H100 (FA2 there: 35%), so the same
  share of each GPU's own peak holds where the engine runs its generation's kernel (FA3 on Hopper). The context's
  FLOPs of a 3,072-token chunk run at 71% of peak in the data: they agree, so the asymptote is not fitted (the grid
  stops short of it) but taken from the papers; r_half, n, diag_factor and the floor are fitted.
- Decode: floor + bytes / (decode_eff·bandwidth): 128 sequences x 2,048 positions move 537 MB in 0.349 ms, 1.54
  TB/s, 75% of 2,039 GB/s, as far as the linear layers' streaming; a single sequence is floor-bound (17-18 us
  whatever its context). A per-sequence term, a smooth max in place of the sum, and a share rising with the batch
  were tried and fit no better: what the smooth curve misses are the kernel's own steps (24 sequences take 9 us at a
  short context where 16 take 16, as if FlashAttention's split-KV heuristic stopped splitting there, one kernel in
  place of two; thread blocks of batch x KV heads in waves over the SMs, so 64 sequences stream at 64% of bandwidth
  where 48 and 96 reach 85%).
  Prefill has the same steps in chunk (a 384-token chunk is 96 blocks, one wave; 512 is 128, two), which the Hill
  rise smooths over.
Other GPUs: the same shares of their own peak FLOP/s and bandwidth (gpu.py scales; the floors are kept).

Fit and test are kept apart on the grid: points whose (chunk, context) or (batch, context) grid indices sum to an
even number fit (FIT), the others only test (a checkerboard, so both halves span the whole grid); frame()'s
`split` column says which. benchmarks/sim/attention_net.py prints both errors beside the sim's flat roofline;
tests/test_measured_attention_net.py asserts them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from prefillbench.backends.sim.measured import profiles
from prefillbench.backends.sim.measured import store
from prefillbench.backends.sim.specs import SimConfigError

VIDUR_REPO = "microsoft/vidur"
ATTENTION_COMMIT = "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a"
ATTENTION_PATH = "data/profiling/a100/attention.csv"
DATA_DIR = Path(__file__).resolve().parent / "data"
SAMPLE = DATA_DIR / "vidur_a100_attention.csv"

#: The profile's shape (Llama-2-70B at TP 2) and what one GPU of it computes.
SHAPE = {"n_embd": 8192, "n_q_head": 64, "n_kv_head": 8, "num_tensor_parallel_workers": 2, "block_size": 16}
HEADS, KV_HEADS, HEAD_DIM = 32, 4, 128
DTYPE_BYTES = 2.0
#: A100-SXM's spec figures (presets.GPU_PRESETS['A100-SXM'], as linear.PEAKS holds them): Vidur ran on DGX A100s.
A100_FLOPS, A100_MEM_BW = 312e12, 2039e9

#: FlashAttention-2's published forward rate on A100 (arXiv 2307.08691: up to 230 TFLOP/s, 73% of peak): the share of
#: peak a long chunk reaches, where the measured grid (<= 4,096 tokens) stops short of saturation.
FA2_PEAK_SHARE = 0.73
FA2_SOURCE = ("FlashAttention-2 (arXiv 2307.08691, sec. 4: forward up to 230 TFLOPs/s, 73% of A100 peak, rising with "
              "sequence length, Fig. 5); FlashAttention-3 (arXiv 2407.08608: 740 TFLOPs/s FP16, 75% of H100 peak)")

#: Grid points kept in the sample (every one present in Vidur's file; prefill only where chunk + context <= 4,096).
PREFILL_CHUNKS = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
PREFILL_CONTEXTS = (0, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 3584)
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DECODE_CONTEXTS = (32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4032)
SAMPLE_COLUMNS = ("kind", "batch_size", "prefill_chunk_size", "kv_cache_size", "median_ms", "std_ms")


# ---- the sim's FLOPs and bytes ----------------------------------------------------------------------------------
def prefill_cost(chunk, start, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype_bytes=DTYPE_BYTES):
    """(FLOPs, bytes, query rows, diagonal FLOPs) of one causal chunk of `chunk` tokens after `start` cached ones on
    one GPU, as cost.py's shape_terms counts them (scalars or numpy arrays). Diagonal FLOPs are the chunk attending
    itself (L(L+1)/2 pairs); query rows are heads x chunk, the thread-block grid FlashAttention spreads."""
    L, s = np.asarray(chunk, dtype=float), np.asarray(start, dtype=float)
    q, kv = heads * head_dim, kv_heads * head_dim
    diag_pairs = L * (L + 1) / 2
    flops = 4.0 * head_dim * heads * (L * s + diag_pairs)
    nbytes = dtype_bytes * (2 * L * q + 2 * (s + L) * kv + 2 * L * kv)
    return flops, nbytes, heads * L, 4.0 * head_dim * heads * diag_pairs


def decode_cost(batch, context, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype_bytes=DTYPE_BYTES):
    """(FLOPs, bytes) of `batch` decode tokens each attending `context` positions (itself included) on one GPU, as
    cost.py's shape_terms counts them."""
    k, c = np.asarray(batch, dtype=float), np.asarray(context, dtype=float)
    q, kv = heads * head_dim, kv_heads * head_dim
    ctx = k * c
    return 4.0 * head_dim * heads * ctx, dtype_bytes * (2 * ctx * kv + 2 * k * q + 2 * k * kv)


# ---- the curve ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionCurve:
    """Prefill and decode attention time on one GPU, as shares of its peaks (fitted on Vidur's A100 profile)."""

    gpu: str
    prefill_eff: float  # share of peak FLOP/s a long chunk reaches (FlashAttention-2's 73%)
    decode_eff: float  # share of DRAM bandwidth decode attention streams the KV cache at
    prefill_floor_s: float  # a prefill kernel's fixed device time
    decode_floor_s: float  # a decode kernel's fixed device time (one short sequence)
    source: str
    prefill_half_rows: float = 0.0  # query rows (heads x tokens) at which prefill reaches half of prefill_eff; 0: flat
    prefill_hill: float = 1.0  # steepness n of that rise
    diag_factor: float = 1.0  # a causal diagonal (chunk-on-itself) FLOP's cost in context FLOPs

    def prefill_share(self, query_rows=0.0):
        """Attained share of peak FLOP/s at `query_rows` query rows (0: unknown, the long-chunk share)."""
        r = np.asarray(query_rows, dtype=float)
        if not self.prefill_half_rows:
            return self.prefill_eff + 0.0 * r
        x = (np.maximum(r, 1e-9) / self.prefill_half_rows) ** self.prefill_hill
        return np.where(r > 0, self.prefill_eff * x / (1.0 + x), self.prefill_eff)

    def prefill_seconds(self, flops, nbytes, peak_flops: float, mem_bw: float, query_rows=0.0, diag_flops=0.0):
        """floor + max(compute, memory). query_rows: heads x query tokens of the launch (prefill_cost's); diag_flops:
        the part of `flops` on the chunks' causal diagonal blocks. Without them (0) the long-chunk rate is assumed,
        which under-prices short chunks (see prefill_share)."""
        f = np.asarray(flops, dtype=float) + (self.diag_factor - 1.0) * np.asarray(diag_flops, dtype=float)
        t_c = f / (self.prefill_share(query_rows) * peak_flops)
        t_m = np.asarray(nbytes, dtype=float) / (self.decode_eff * mem_bw)
        return _out(self.prefill_floor_s + np.maximum(t_c, t_m))

    def decode_seconds(self, nbytes, flops, peak_flops: float, mem_bw: float):
        """floor + max(bytes at decode_eff of bandwidth, FLOPs at prefill_eff of peak)."""
        t_m = np.asarray(nbytes, dtype=float) / (self.decode_eff * mem_bw)
        t_c = np.asarray(flops, dtype=float) / (self.prefill_eff * peak_flops)
        return _out(self.decode_floor_s + np.maximum(t_m, t_c))


def _out(x):
    x = np.asarray(x, dtype=float)
    return x if x.ndim else float(x)


# ---- Vidur's file and the shipped sample ------------------------------------------------------------------------
def sample_frame(raw: pd.DataFrame, grid: bool = True) -> pd.DataFrame:
    """What the shipped sample keeps of Vidur's attention.csv (read whole): the median over its repeated rows of
    each point's median and std (ms), prefill by (chunk, context), decode by (batch, context); only the grid points
    when `grid`. Rows of another shape than SHAPE are refused."""
    for col, want in SHAPE.items():
        if col not in raw.columns:
            raise SimConfigError(f"no {col} column: not Vidur's attention profile ({ATTENTION_PATH} at "
                                 f"{ATTENTION_COMMIT[:7]})")
        got = set(pd.unique(raw[col]))
        if got != {want}:
            raise SimConfigError(f"attention profile with {col} {sorted(got)}: the curve is fitted on {SHAPE}")
    prefill = raw["is_prefill"].map(lambda v: str(v).strip().lower() == "true").astype(bool)
    parts = []
    for kind, rows, op in (("prefill", raw[prefill], "attn_prefill"), ("decode", raw[~prefill], "attn_decode")):
        keys = ["batch_size", "prefill_chunk_size", "kv_cache_size"]
        g = rows.groupby(keys, as_index=False).agg(median_ms=(f"time_stats.{op}.median", "median"),
                                                  std_ms=(f"time_stats.{op}.std", "median"))
        g.insert(0, "kind", kind)
        if grid and kind == "prefill":
            g = g[g["prefill_chunk_size"].isin(PREFILL_CHUNKS) & g["kv_cache_size"].isin(PREFILL_CONTEXTS)]
        elif grid:
            g = g[g["batch_size"].isin(DECODE_BATCHES) & g["kv_cache_size"].isin(DECODE_CONTEXTS)]
        parts.append(g)
    df = pd.concat(parts, ignore_index=True)
    df["median_ms"] = df["median_ms"].round(6)
    df["std_ms"] = df["std_ms"].map(lambda x: float(f"{x:.2g}"))
    for c in ("batch_size", "prefill_chunk_size", "kv_cache_size"):
        df[c] = df[c].astype(int)
    return df[list(SAMPLE_COLUMNS)].sort_values(["kind", "batch_size", "prefill_chunk_size", "kv_cache_size"],
                                                kind="stable").reset_index(drop=True)


def vidur_file(root: str | Path) -> Path:
    """attention.csv in a Vidur checkout at ATTENTION_COMMIT (or the file itself, or its a100 folder)."""
    root = Path(root)
    for p in (root, root / ATTENTION_PATH, root / "a100" / "attention.csv", root / "attention.csv"):
        if p.is_file():
            return p
    raise SimConfigError(f"no attention profile under {root}: expected {ATTENTION_PATH} ({VIDUR_REPO} at "
                         f"{ATTENTION_COMMIT[:7]}; later commits no longer hold it)")


def read_vidur(root: str | Path, grid: bool = True) -> pd.DataFrame:
    return sample_frame(pd.read_csv(vidur_file(root)), grid)


SAMPLE_HEADER = (f"# {VIDUR_REPO}@{ATTENTION_COMMIT} {ATTENTION_PATH} (A100, FlashAttention, Llama-2-70B at TP 2: "
                 "32 q / 4 kv heads of 128, block 16): median over repeated rows of attn_prefill / attn_decode median "
                 "and std (ms) at attention.py's grid; made by python -m benchmarks.sim.make_attn_net_samples\n")


def write_sample(df: pd.DataFrame, path: str | Path = SAMPLE) -> None:
    profiles.write_csv(df, path, SAMPLE_HEADER)


def read_sample(path: str | Path = SAMPLE) -> pd.DataFrame:
    return profiles.read_csv(path)


# ---- rows with their FLOPs, bytes and split -----------------------------------------------------------------------
def _checkerboard(a: pd.Series, b: pd.Series) -> np.ndarray:
    """FIT where the two grid indices (positions among the values present) sum to an even number."""
    ia = a.map({v: i for i, v in enumerate(sorted(a.unique()))})
    ib = b.map({v: i for i, v in enumerate(sorted(b.unique()))})
    return ((ia + ib) % 2 == 0).to_numpy()


def frame(sample: pd.DataFrame) -> pd.DataFrame:
    """The sample's rows with median_s, std_s, flops, nbytes, query_rows, diag_flops and split (fit | test)."""
    df = sample.copy()
    df["median_s"] = df["median_ms"] * 1e-3
    df["std_s"] = df["std_ms"] * 1e-3
    pre = (df["kind"] == "prefill").to_numpy()
    fl_p, by_p, rows_p, diag_p = prefill_cost(df["prefill_chunk_size"], df["kv_cache_size"])
    fl_d, by_d = decode_cost(df["batch_size"], df["kv_cache_size"] + 1)  # a decode attends its cache and itself
    df["flops"] = np.where(pre, fl_p, fl_d)
    df["nbytes"] = np.where(pre, by_p, by_d)
    df["query_rows"] = np.where(pre, rows_p, HEADS * df["batch_size"])
    df["diag_flops"] = np.where(pre, diag_p, 0.0)
    fit = np.zeros(len(df), dtype=bool)
    p, d = df[pre], df[~pre]
    fit[pre] = _checkerboard(p["prefill_chunk_size"], p["kv_cache_size"])
    fit[~pre] = _checkerboard(d["batch_size"], d["kv_cache_size"])
    df["split"] = np.where(fit, "fit", "test")
    return df


@lru_cache(maxsize=None)
def _sample_frame() -> pd.DataFrame:
    return frame(read_sample())


def load_frame(path: str | Path | None = None) -> pd.DataFrame:
    """frame() of the shipped sample (None) or of a Vidur checkout at `path` (its whole grid). A copy."""
    return _sample_frame().copy() if path is None else frame(read_vidur(path, grid=False))


# ---- fitting --------------------------------------------------------------------------------------------------------
def _fit(residual, x0, lo, hi, scale):
    """least_squares on log-time residuals, soft-L1 beyond `scale` (the data's own relative spread) so that a grid
    point where the kernel's heuristics jump (a split-KV change) pulls the curve less than a square would."""
    r = least_squares(residual, x0, bounds=(lo, hi), loss="soft_l1", f_scale=scale, x_scale="jac")
    return r.x


def noise(df: pd.DataFrame) -> float:
    """The measurements' own relative spread: the median over the rows of std / median."""
    rel = (df["std_s"] / df["median_s"]).to_numpy()
    return float(np.median(rel[np.isfinite(rel)]))


def fit_prefill(df: pd.DataFrame, peak_flops: float = A100_FLOPS, mem_bw: float = A100_MEM_BW,
                decode_eff: float = 0.75) -> dict:
    """prefill_floor_s, prefill_half_rows, prefill_hill and diag_factor through df's prefill rows, prefill_eff held
    at FlashAttention-2's published share (FA2_PEAK_SHARE)."""
    p = df[df["kind"] == "prefill"]
    t = p["median_s"].to_numpy()

    def curve(x):
        return AttentionCurve("a100", FA2_PEAK_SHARE, decode_eff, x[0] * 1e-6, 0.0, "", prefill_half_rows=x[1] * 1e3,
                              prefill_hill=x[2], diag_factor=x[3])

    def residual(x):
        c = curve(x)
        pred = c.prefill_seconds(p["flops"], p["nbytes"], peak_flops, mem_bw, p["query_rows"], p["diag_flops"])
        return np.log(pred / t)

    # In us and thousands of rows, so the parameters are of one order; floor < 50 us, diag 1-16x, n 0.1-6.
    x = _fit(residual, [8.0, 10.0, 1.0, 3.0], [0.0, 0.1, 0.1, 1.0], [50.0, 1e4, 6.0, 16.0], max(noise(p), 0.01))
    return {"prefill_floor_s": x[0] * 1e-6, "prefill_half_rows": x[1] * 1e3, "prefill_hill": x[2], "diag_factor": x[3]}


def fit_decode(df: pd.DataFrame, peak_flops: float = A100_FLOPS, mem_bw: float = A100_MEM_BW) -> dict:
    """decode_eff and decode_floor_s through df's decode rows."""
    d = df[df["kind"] == "decode"]
    t = d["median_s"].to_numpy()

    def residual(x):
        c = AttentionCurve("a100", FA2_PEAK_SHARE, x[0], 0.0, x[1] * 1e-6, "")
        return np.log(c.decode_seconds(d["nbytes"], d["flops"], peak_flops, mem_bw) / t)

    x = _fit(residual, [0.7, 10.0], [0.05, 0.0], [1.0, 50.0], max(noise(d), 0.01))
    return {"decode_eff": x[0], "decode_floor_s": x[1] * 1e-6}


def fit_attention(df: pd.DataFrame, peak_flops: float = A100_FLOPS, mem_bw: float = A100_MEM_BW,
                  gpu: str = "a100") -> AttentionCurve:
    """The AttentionCurve through df's rows (give it the FIT rows: df[df.split == 'fit'])."""
    dec = fit_decode(df, peak_flops, mem_bw)
    pre = fit_prefill(df, peak_flops, mem_bw, dec["decode_eff"])
    n_p, n_d = int((df["kind"] == "prefill").sum()), int((df["kind"] == "decode").sum())
    source = (f"fitted (least squares on log time) to {VIDUR_REPO}@{ATTENTION_COMMIT[:7]} {ATTENTION_PATH} medians "
              f"(A100 FlashAttention, Llama-2-70B TP2: 32/4 heads of 128), {n_p} prefill and {n_d} decode grid points "
              f"(the checkerboard's FIT half); prefill_eff {FA2_PEAK_SHARE:.0%} of peak from {FA2_SOURCE}; other GPUs: "
              "the same shares of their own peaks")
    return AttentionCurve(gpu, FA2_PEAK_SHARE, dec["decode_eff"], pre["prefill_floor_s"], dec["decode_floor_s"],
                          source, prefill_half_rows=pre["prefill_half_rows"], prefill_hill=pre["prefill_hill"],
                          diag_factor=pre["diag_factor"])


@lru_cache(maxsize=None)
def fitted_attention() -> AttentionCurve:
    """The A100 fit on the shipped sample's FIT half; other GPUs use the same shares of their own peaks."""
    df = _sample_frame()
    return fit_attention(df[df["split"] == "fit"])


@lru_cache(maxsize=None)
def shipped_attention() -> AttentionCurve:
    """fitted_attention() as it was when data/fitted_curves.json was written (store.py: why shipped)."""
    return AttentionCurve(**store.section("attention"))


# ---- checking -------------------------------------------------------------------------------------------------------
def predict(df: pd.DataFrame, curve: AttentionCurve, peak_flops: float = A100_FLOPS,
            mem_bw: float = A100_MEM_BW) -> np.ndarray:
    pre = (df["kind"] == "prefill").to_numpy()
    tp = curve.prefill_seconds(df["flops"], df["nbytes"], peak_flops, mem_bw, df["query_rows"], df["diag_flops"])
    td = curve.decode_seconds(df["nbytes"], df["flops"], peak_flops, mem_bw)
    return np.where(pre, tp, td)


def flat_roofline(df: pd.DataFrame, peak_flops: float = A100_FLOPS, mem_bw: float = A100_MEM_BW,
                  compute_fraction: float = 0.8, memory_fraction: float = 0.85) -> np.ndarray:
    """The sim's spec-sheet price before this curve (cost.py _roof, decode_attention_fraction 1):
    max(FLOPs / (0.8·peak), bytes / (0.85·bandwidth))."""
    return np.maximum(df["flops"].to_numpy() / (compute_fraction * peak_flops),
                      df["nbytes"].to_numpy() / (memory_fraction * mem_bw))


def errors(df: pd.DataFrame, curve: AttentionCurve | None = None) -> pd.DataFrame:
    """df with pred_s, flat_s and their relative errors (prediction / measured - 1)."""
    curve = curve or fitted_attention()
    out = df.copy()
    out["pred_s"] = predict(out, curve)
    out["flat_s"] = flat_roofline(out)
    out["err"] = out["pred_s"] / out["median_s"] - 1.0
    out["flat_err"] = out["flat_s"] / out["median_s"] - 1.0
    return out


def spread(df: pd.DataFrame) -> pd.Series:
    """The data's own spread about a smooth surface, with no model: each TEST point's error when it is read off its
    FIT neighbours on the grid (the geometric mean of the two on either side, along each axis that has both, the axes
    averaged in log). The checkerboard makes every interior TEST point's four neighbours FIT points; edge points
    without a pair on either axis are left out. Indexed like df's TEST rows that have one."""
    out = {}
    axes_of = {"prefill": ("prefill_chunk_size", "kv_cache_size"), "decode": ("batch_size", "kv_cache_size")}
    for kind, (a, b) in axes_of.items():
        part = df[df["kind"] == kind]
        ia = {v: i for i, v in enumerate(sorted(part[a].unique()))}
        ib = {v: i for i, v in enumerate(sorted(part[b].unique()))}
        fit = {(ia[r[a]], ib[r[b]]): math.log(r["median_s"]) for _, r in part[part["split"] == "fit"].iterrows()}
        for idx, r in part[part["split"] == "test"].iterrows():
            i, j = ia[r[a]], ib[r[b]]
            axes = [(fit[p] + fit[q]) / 2 for p, q in (((i - 1, j), (i + 1, j)), ((i, j - 1), (i, j + 1)))
                    if p in fit and q in fit]
            if axes:
                out[idx] = math.exp(sum(axes) / len(axes)) / r["median_s"] - 1.0
    return pd.Series(out, dtype=float)


def summary(err: pd.DataFrame) -> pd.DataFrame:
    """Per kind and split: points, median and worst |error| of the curve and of the flat roofline, the rows' own std
    (noise) and, on TEST rows, the neighbour read-off's median and worst |error| (spread)."""
    rows = []
    sp = spread(err).abs()
    for (kind, split), g in err.groupby(["kind", "split"], sort=True):
        s = sp.reindex(g.index).dropna()
        rows.append({"kind": kind, "split": split, "points": len(g),
                     "median_err": float(np.median(np.abs(g["err"]))), "worst_err": float(np.max(np.abs(g["err"]))),
                     "flat_median_err": float(np.median(np.abs(g["flat_err"]))),
                     "flat_worst_err": float(np.max(np.abs(g["flat_err"]))), "noise": noise(g),
                     "spread_median": float(s.median()) if len(s) else np.nan,
                     "spread_worst": float(s.max()) if len(s) else np.nan})
    return pd.DataFrame(rows)


__all__ = ["ATTENTION_COMMIT", "ATTENTION_PATH", "AttentionCurve", "FA2_PEAK_SHARE", "SAMPLE", "decode_cost", "errors",
           "fit_attention", "fitted_attention", "shipped_attention", "flat_roofline", "frame", "load_frame", "predict", "prefill_cost",
           "read_sample", "read_vidur", "sample_frame", "spread", "summary", "write_sample"]
