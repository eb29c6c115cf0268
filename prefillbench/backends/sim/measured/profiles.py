"""Vidur's measured operator times (one transformer layer's linears, norms, rotary, activation and residual add), as
rows that carry each operator's FLOPs and bytes the way the sim counts them.

Source: microsoft/vidur at main 7d47513 (VIDUR_COMMIT), data/profiling/compute/<gpu>/<org>/<model>/mlp.csv: per
model, tensor-parallel degree and token count, the min/max/mean/median/std in ms of 20 timed forward passes of each
operator (vidur/profiling/mlp/mlp_wrapper.py: 2 warm-up and 20 active steps; fp16, which moves the bytes bf16 does
and runs at the same tensor rate). The shipped sample (data/vidur_<gpu>_mlp.csv, made by sample_frame and
`python -m benchmarks.sim.make_samples`) keeps the median and std of each operator at the token counts of
TOKEN_GRID, the first row where Vidur's files repeat one (their N = 4096 and 2048 rows come twice).

Fit and test are kept apart by model: curves are fitted on FIT_MODELS (Llama-2-7B, Llama-2-70B, every TP and token
count) and tested on TEST_MODELS (CodeLlama-34B, internlm-20B, Qwen-72B, the Llama-3s where measured, phi-2).

FLOPs and bytes (2 bytes an element), per GPU of a Megatron tensor-parallel layer of TP shards (Vidur's
ColumnParallelLinear / RowParallelLinear, vidur/profiling/mlp/mlp_impl.py): the fused QKV (q heads and 2x the KV
heads) and the fused gate+up (2 x FFN when gated) are split by columns, O and down by rows; each GEMM is
2·n·d_in·d_out FLOPs and moves its weight once plus its input and output rows, as cost.py's _linear_term counts.
Elementwise operators move: a norm its n x hidden rows in and out (and its weight); rotary its local q and k in
place, in and out, and a cos/sin row per token; the activation its input (2 x FFN/TP when gated) and output; the
residual add two inputs and an output (phi-2's parallel block adds three tensors, two adds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from prefillbench.backends.sim.specs import SimConfigError

VIDUR_REPO = "microsoft/vidur"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
VIDUR_COMPUTE = "data/profiling/compute"
DATA_DIR = Path(__file__).resolve().parent / "data"
GPUS = ("h100", "a100", "a40")

#: Fitted on these (every TP, every token count), tested on TEST_MODELS: the issue keeps the two apart.
FIT_MODELS = ("Llama-2-7b-hf", "Llama-2-70b-hf")
TEST_MODELS = ("CodeLlama-34b-Instruct-hf", "internlm-20b", "Qwen-72B", "Meta-Llama-3-8B", "Meta-Llama-3-70B", "phi-2")
#: Token counts kept in the sample: powers of two and the steps between them, 1 to 4,096 (Vidur's files hold every
#: count in steps of 8 to 32 too; a checkout given by path is read whole).
TOKEN_GRID = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)

#: Vidur's operator name -> the class the sim prices it as.
GEMM_OPS = {"attn_pre_proj": "qkv", "attn_post_proj": "o_proj", "mlp_up_proj": "gate_up", "mlp_down_proj": "down"}
ELEMENTWISE_OPS = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "attn_rope": "rope",
                   "mlp_act": "act", "add": "add"}
OPS = {**GEMM_OPS, **ELEMENTWISE_OPS}
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")
KEY_COLUMNS = ("num_tensor_parallel_workers", "num_tokens")
DTYPE_BYTES = 2.0


@dataclass(frozen=True)
class OpRow:
    """One operator of one measured layer: its median time and what it computes and moves on one GPU."""

    gpu: str
    model: str
    tp: int
    n_tokens: int
    op: str  # Vidur's name (OPS)
    median_s: float
    std_s: float  # spread of the 20 timed passes the median is of
    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    use_gated_mlp: bool
    parallel_block: bool  # attention and MLP side by side (phi-2): no post-attention norm, a three-way add
    flops: float
    nbytes: float
    row_bytes: float  # elementwise: bytes of one token's row (row_bytes()); GEMMs: 0

    @property
    def op_class(self) -> str:
        return OPS[self.op]

    @property
    def is_gemm(self) -> bool:
        return self.op in GEMM_OPS

    @property
    def fit(self) -> bool:
        return self.model in FIT_MODELS


def gemm_dims(op: str, tp, n_head, n_kv_head, n_embd, n_expanded_embd, use_gated_mlp):
    """(d_in, d_out) of a linear on one of tp GPUs: QKV and gate+up split by columns, O and down by rows."""
    head_dim = np.asarray(n_embd) / np.asarray(n_head)
    q = n_head * head_dim / tp
    kv = n_kv_head * head_dim / tp
    ffn = np.asarray(n_expanded_embd) / tp
    if op == "attn_pre_proj":
        return n_embd, q + 2 * kv
    if op == "attn_post_proj":
        return q, n_embd
    if op == "mlp_up_proj":
        return n_embd, np.where(use_gated_mlp, 2.0, 1.0) * ffn
    if op == "mlp_down_proj":
        return ffn, n_embd
    raise ValueError(f"{op} is no linear")


def op_cost(op: str, n, tp, n_head, n_kv_head, n_embd, n_expanded_embd, use_gated_mlp, parallel_block=False,
            dtype_bytes: float = DTYPE_BYTES):
    """(FLOPs, bytes) of operator `op` on n tokens on one of tp GPUs (numpy arrays or scalars). Elementwise
    operators are priced by bytes alone (their FLOPs are a few per byte), so their FLOPs are 0."""
    b = dtype_bytes
    n = np.asarray(n, dtype=float)
    if op in GEMM_OPS:
        d_in, d_out = gemm_dims(op, tp, n_head, n_kv_head, n_embd, n_expanded_embd, use_gated_mlp)
        return 2.0 * n * d_in * d_out, b * (d_in * d_out + n * d_in + n * d_out)
    d = np.asarray(n_embd, dtype=float)
    head_dim = d / np.asarray(n_head)
    if op in ("input_layernorm", "post_attention_layernorm"):
        nbytes = b * (2 * n * d + d)  # rows in and out, the weight once
    elif op == "attn_rope":
        q, k = n_head * head_dim / tp, n_kv_head * head_dim / tp
        nbytes = b * (2 * n * (q + k) + n * head_dim)  # q and k in place, in and out; cos/sin of rotary_dim per token
    elif op == "mlp_act":
        ffn = np.asarray(n_expanded_embd) / tp
        nbytes = b * n * ffn * np.where(use_gated_mlp, 3.0, 2.0)  # SiLU-and-mul reads gate and up, writes one
    elif op == "add":
        nbytes = b * n * d * np.where(parallel_block, 6.0, 3.0)
    else:
        raise ValueError(f"unknown operator {op}")
    return np.zeros_like(nbytes, dtype=float), nbytes


def row_bytes(op: str, tp, n_head, n_kv_head, n_embd, n_expanded_embd, use_gated_mlp, parallel_block=False,
              dtype_bytes: float = DTYPE_BYTES):
    """Bytes one token's row moves through an elementwise kernel: vLLM's RMSNorm, rotary and SiLU-and-mul kernels
    run one thread block per token, so a few tokens take one block's time over its row (a norm's block reads the
    weight too): the bytes of the operator on one token."""
    return op_cost(op, 1, tp, n_head, n_kv_head, n_embd, n_expanded_embd, use_gated_mlp, parallel_block, dtype_bytes)[1]


# ---- Vidur's files and the shipped sample -----------------------------------------------------------------------
def vidur_files(root: str | Path, gpu: str) -> dict[str, Path]:
    """Each model's mlp.csv for `gpu` under a Vidur checkout (or its data/profiling/compute folder)."""
    root = Path(root)
    for base in (root / VIDUR_COMPUTE / gpu, root / gpu):
        files = sorted(base.glob("*/*/mlp.csv"))
        if files:
            return {f.parent.name: f for f in files}
    raise SimConfigError(f"no Vidur profile for {gpu} under {root}: expected {VIDUR_COMPUTE}/{gpu}/<org>/<model>/mlp.csv "
                         f"(microsoft/vidur at {VIDUR_COMMIT[:7]})")


def _median_col(op: str) -> str:
    return f"time_stats.{op}.median"


def _std_col(op: str) -> str:
    return f"time_stats.{op}.std"


def sample_columns() -> list[str]:
    return ["model", *KEY_COLUMNS, *SHAPE_COLUMNS, *(c for op in OPS for c in (_median_col(op), _std_col(op)))]


def _two_figures(x: float) -> float:
    """std to two significant figures, at the medians' 1e-6 ms (a zero spread stays 0, not 4e-19)."""
    return float(f"{round(x, 6):.2g}") if x == x else x


def sample_frame(frames: dict[str, pd.DataFrame], tokens: tuple[int, ...] | None = TOKEN_GRID) -> pd.DataFrame:
    """What the shipped sample keeps of one GPU's Vidur files (model name -> its mlp.csv read whole): per model, TP
    and token count in `tokens` (None: all), the first row, its shapes and each operator's median (ms, rounded to
    1e-6 ms, below the files' 1e-3 ms resolution) and std (two significant figures)."""
    parts = []
    for model in sorted(frames):
        df = frames[model]
        missing = [c for c in (*KEY_COLUMNS, *SHAPE_COLUMNS) if c not in df.columns]
        if missing:
            raise SimConfigError(f"{model}'s mlp.csv has no {', '.join(missing)} column: not a Vidur MLP profile "
                                 f"(some branches hold input-only files; use main {VIDUR_COMMIT[:7]})")
        df = df.drop_duplicates(list(KEY_COLUMNS), keep="first")
        if tokens is not None:
            df = df[df["num_tokens"].isin(tokens)]
        out = df.reindex(columns=[c for c in sample_columns() if c != "model"]).copy()
        out.insert(0, "model", model)
        parts.append(out)
    if not parts:
        raise SimConfigError("no Vidur profiles to sample")
    df = pd.concat(parts, ignore_index=True)
    if df[[_median_col(op) for op in GEMM_OPS]].isna().any().any():
        raise SimConfigError("a Vidur MLP profile without timings: use main "
                             f"{VIDUR_COMMIT[:7]} (some branches hold input-only files)")
    for op in OPS:
        df[_median_col(op)] = df[_median_col(op)].round(6)
        df[_std_col(op)] = df[_std_col(op)].map(_two_figures)
    for c in (*KEY_COLUMNS, *SHAPE_COLUMNS[:4]):
        df[c] = df[c].astype(int)
    df["use_gated_mlp"] = df["use_gated_mlp"].map(lambda v: str(v).strip().lower() == "true").astype(bool)
    return df.sort_values(["model", *KEY_COLUMNS], kind="stable").reset_index(drop=True)


def read_vidur(root: str | Path, gpu: str, tokens: tuple[int, ...] | None = TOKEN_GRID) -> pd.DataFrame:
    """sample_frame of `gpu`'s mlp.csv files under a Vidur checkout."""
    return sample_frame({m: pd.read_csv(p) for m, p in vidur_files(root, gpu).items()}, tokens)


def sample_path(gpu: str) -> Path:
    return DATA_DIR / f"vidur_{gpu}_mlp.csv"


def sample_header(gpu: str) -> str:
    return (f"# {VIDUR_REPO}@{VIDUR_COMMIT} {VIDUR_COMPUTE}/{gpu}/<org>/<model>/mlp.csv: median and std (ms) of each "
            "operator, first row per (model, TP, tokens), tokens in profiles.TOKEN_GRID; made by "
            "python -m benchmarks.sim.make_samples\n")


def write_csv(df: pd.DataFrame, path: str | Path, header: str) -> None:
    """A shipped sample: one `# source` line, then the CSV (every measured/ sample is written so)."""
    with open(path, "w", newline="") as f:
        f.write(header)
        df.to_csv(f, index=False, lineterminator="\n")


def read_csv(path: str | Path) -> pd.DataFrame:
    """A sample written by write_csv, its source line skipped."""
    return pd.read_csv(path, comment="#")


def write_sample(df: pd.DataFrame, path: str | Path, gpu: str) -> None:
    write_csv(df, path, sample_header(gpu))


def read_sample(path: str | Path) -> pd.DataFrame:
    df = read_csv(path)
    df["use_gated_mlp"] = df["use_gated_mlp"].astype(bool)
    return df


# ---- rows ---------------------------------------------------------------------------------------------------------
def long_frame(wide: pd.DataFrame, gpu: str) -> pd.DataFrame:
    """One row per (model, TP, tokens, operator) measured: gpu, model, tp, n_tokens, op, op_class, median_s, std_s,
    the shapes, parallel_block, flops, nbytes, row_bytes (elementwise: one token's row, row_bytes(); GEMMs 0)."""
    parallel = wide[_median_col("post_attention_layernorm")].isna().to_numpy()
    parts = []
    for op, cls in OPS.items():
        t = wide[_median_col(op)].to_numpy(dtype=float)
        keep = ~np.isnan(t)
        if not keep.any():
            continue
        w = wide[keep]
        shapes = {c: w[c].to_numpy() for c in SHAPE_COLUMNS}
        tp = w["num_tensor_parallel_workers"].to_numpy()
        n = w["num_tokens"].to_numpy()
        flops, nbytes = op_cost(op, n, tp, **shapes, parallel_block=parallel[keep])
        rows = (np.zeros(len(n)) if op in GEMM_OPS else
                np.asarray(row_bytes(op, tp, **shapes, parallel_block=parallel[keep]), dtype=float))
        parts.append(pd.DataFrame({
            "gpu": gpu, "model": w["model"].to_numpy(), "tp": tp, "n_tokens": n, "op": op, "op_class": cls,
            "median_s": t[keep] * 1e-3, "std_s": w[_std_col(op)].to_numpy(dtype=float) * 1e-3,
            **shapes, "parallel_block": parallel[keep],
            "flops": np.broadcast_to(flops, n.shape).astype(float), "nbytes": np.asarray(nbytes, dtype=float),
            "row_bytes": rows}))
    return pd.concat(parts, ignore_index=True)


@lru_cache(maxsize=None)
def _sample_long(gpu: str) -> pd.DataFrame:
    return long_frame(read_sample(sample_path(gpu)), gpu)


def load_frame(gpu: str, path: str | Path | None = None, tokens: tuple[int, ...] | None = None) -> pd.DataFrame:
    """long_frame of the shipped sample of `gpu` (path None) or of a Vidur checkout at `path` (every token count
    unless `tokens` names some). A copy: callers may change it."""
    if gpu not in GPUS:
        raise SimConfigError(f"no Vidur profile for GPU {gpu!r}: profiled are {', '.join(GPUS)}")
    if path is None:
        df = _sample_long(gpu).copy()
        return df if tokens is None else df[df["n_tokens"].isin(tokens)].reset_index(drop=True)
    return long_frame(read_vidur(path, gpu, tokens), gpu)


def to_rows(df: pd.DataFrame) -> list[OpRow]:
    names = [f for f in OpRow.__dataclass_fields__]
    out = []
    for rec in df[names].itertuples(index=False, name=None):
        r = dict(zip(names, rec))
        out.append(OpRow(**{**r, "tp": int(r["tp"]), "n_tokens": int(r["n_tokens"]), "n_head": int(r["n_head"]),
                            "n_kv_head": int(r["n_kv_head"]), "n_embd": int(r["n_embd"]),
                            "n_expanded_embd": int(r["n_expanded_embd"]), "use_gated_mlp": bool(r["use_gated_mlp"]),
                            "parallel_block": bool(r["parallel_block"]), "median_s": float(r["median_s"]),
                            "std_s": float(r["std_s"]) if not math.isnan(r["std_s"]) else 0.0,
                            "flops": float(r["flops"]), "nbytes": float(r["nbytes"]),
                            "row_bytes": float(r["row_bytes"])}))
    return out


def load_rows(gpu: str, path: str | Path | None = None, tokens: tuple[int, ...] | None = None) -> list[OpRow]:
    """The measured operator rows of `gpu`: the shipped sample, or a Vidur checkout at `path`."""
    return to_rows(load_frame(gpu, path, tokens))


__all__ = ["DATA_DIR", "ELEMENTWISE_OPS", "FIT_MODELS", "GEMM_OPS", "GPUS", "OPS", "OpRow", "TEST_MODELS",
           "TOKEN_GRID", "VIDUR_COMMIT", "VIDUR_REPO", "gemm_dims", "load_frame", "load_rows", "long_frame",
           "op_cost", "read_csv", "read_sample", "read_vidur", "row_bytes", "sample_frame", "sample_path", "to_rows",
           "vidur_files",
           "write_csv", "write_sample"]
