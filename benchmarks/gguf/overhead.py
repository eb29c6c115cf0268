"""How much does prefillbench's Python add on top of llama.cpp, and what do mixed steps cost? Checks on the default model.

1. Harness overhead of a decode step at concurrency 4: (step wall time - time inside
   llama_decode) / step wall time, over the decode-only steps of a run (target < 3%).
   "step" is what the engine times (backend.execute); "loop" also counts the
   engine's own bookkeeping and the strategy, from one step's start to the next.
2. pp512 at concurrency 1 through the backend (engine + sequential strategy)
   next to llama-cpp-python's plain `Llama.eval` of the same 512 tokens, in the
   same process, same threads, batch sizes and flash-attention setting
   (target: within 5%). Repetitions alternate between the two; the best of each
   is compared, so a noisy neighbour on the machine does not decide the result.

3. The mixed-step probe (`--mixed`, through the backend's step API): k sequences
   decode at ~64 and at ~1,024 positions while another sequence's prompt goes
   in `--chunk`-token chunks; decode-only, the chunk alone and the chunk + the k
   decodes, interleaved, medians; the piggyback ratio (mixed - chunk) /
   decode-only is what the decodes add to the chunk's step, in decode-only
   steps. `--kv-unified` and `--flash-attn` compare the backend's settings.

Usage: python -m benchmarks.gguf.overhead [-m MODEL.gguf] [-t THREADS] [-r REPS]
       python -m benchmarks.gguf.overhead --mixed [-k 3] [--chunk 64] [--flash-attn on,off] [--kv-unified 0,1]
           [--ubatch 512,32] [--kv-type f16,q8_0]

Run it on an otherwise idle machine: llama.cpp's worker threads spin-wait, so
with every core's worth of threads (the default) another busy process makes
steps up to ~100x slower. On a shared machine, -t 1 still gives fair ratios.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import numpy as np

from prefillbench import engine
from prefillbench.backends.gguf import GGUFBackend
from prefillbench.backends.gguf_lib import install_log
from prefillbench.models import default_model_path
from prefillbench.step import DecodeToken, PrefillChunk, Step
from prefillbench.sequence import Request
from strategies import make_strategy

from benchmarks.lib import cli


def decode_overhead(backend: GGUFBackend, concurrency: int, prompt_len: int, n_gen: int, reps: int) -> dict:
    rng = np.random.default_rng(0)
    step_wall = step_dec = loop_wall = loop_dec = 0.0
    n_steps = 0
    for _ in range(reps):
        requests = [Request(tuple(int(t) for t in rng.integers(3, backend.vocab_size, prompt_len)), n_gen) for _ in range(concurrency)]
        record = engine.run(backend, make_strategy("sequential"), requests, concurrency)
        decode_times = backend.step_decode_seconds
        assert len(decode_times) == len(record.steps)
        for i, step in enumerate(record.steps):
            if step.prefill_chunks or len(step.decode_contexts) != concurrency:
                continue  # decode-only steps with every sequence in flight
            step_wall += step.seconds
            step_dec += decode_times[i]
            n_steps += 1
            if i + 1 < len(record.steps):
                loop_wall += record.steps[i + 1].start - step.start
                loop_dec += decode_times[i]
    return {
        "steps": n_steps,
        "ms_per_step": 1000 * step_wall / n_steps,
        "ms_in_decode": 1000 * step_dec / n_steps,
        "step_overhead": (step_wall - step_dec) / step_wall,
        "loop_overhead": (loop_wall - loop_dec) / loop_wall,
    }


def pp_vs_llama_eval(backend: GGUFBackend, model: str, threads: int, n_prompt: int, reps: int) -> dict:
    from prefillbench.backends.llama_kernels import reference_llama as Llama

    # Llama() takes flash attention as on/off; llama.cpp's "auto" turns it on on the CPU.
    flash = backend.flash_attn != "off"
    llm = Llama(model, n_ctx=max(n_prompt + 16, 512), n_batch=max(n_prompt, 512), n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, flash_attn=flash, logits_all=False, verbose=False)
    install_log()
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(3, backend.vocab_size, n_prompt)]
    request = [Request(tuple(prompt), 1)]
    strategy = make_strategy("sequential")
    ours, theirs = [], []
    engine.run(backend, strategy, request, 1)  # warm-up both
    llm.reset()
    llm.eval(prompt)
    for _ in range(reps):
        record = engine.run(backend, strategy, request, 1)
        ours.append(record.wall)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        theirs.append(time.perf_counter() - t0)
    llm.close()
    return {
        "ours_best": min(ours),
        "theirs_best": min(theirs),
        "ours_median": statistics.median(ours),
        "theirs_median": statistics.median(theirs),
        "ratio_best": min(ours) / min(theirs),
        "ratio_median": statistics.median(ours) / statistics.median(theirs),
    }


def _random_tokens(rng, vocab: int, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(3, vocab, n))


def mixed_step_probe(backend: GGUFBackend, k: int, ctx: int, chunk: int, reps: int) -> dict:
    """Median seconds of decode-only, chunk alone and chunk + k decodes from one cache state."""
    from llama_cpp import llama_memory_seq_rm

    rng = np.random.default_rng(2)
    chunk_start = 128  # the new prompt's chunk sits past a first chunk, as in a chunked run
    backend.prepare(k + 1, max(ctx, chunk_start + chunk) + 2, max(512, chunk + k))
    for seq in range(k):
        prompt = _random_tokens(rng, backend.vocab_size, ctx)
        for a in range(0, ctx, 512):
            backend.execute(Step(prefills=(PrefillChunk(seq, prompt[a : a + 512], a, a + 512 >= ctx),)))
    new_prompt = _random_tokens(rng, backend.vocab_size, chunk_start + chunk)
    backend.execute(Step(prefills=(PrefillChunk(k, new_prompt[:chunk_start], 0, False),)))
    decodes = tuple(DecodeToken(s, int(t), ctx) for s, t in enumerate(rng.integers(3, backend.vocab_size, k)))
    chunk_step = PrefillChunk(k, new_prompt[chunk_start:], chunk_start, False)
    kinds = {
        "decode-only": Step(decodes=decodes),
        "chunk": Step(prefills=(chunk_step,)),
        "mixed": Step(prefills=(chunk_step,), decodes=decodes),
    }
    times: dict[str, list[float]] = {name: [] for name in kinds}
    names = list(kinds)
    for r in range(reps + 1):  # round 0 warms up
        for name in names[r % 3:] + names[: r % 3]:
            t0 = time.perf_counter()
            backend.execute(kinds[name])
            dt = time.perf_counter() - t0
            for seq in range(k + 1):  # trim the cache back to the same state
                llama_memory_seq_rm(backend.mem, backend.slots.slot(seq), ctx if seq < k else chunk_start, -1)
            if r:
                times[name].append(dt)
    for seq in range(k + 1):
        backend.release(seq)
    med = {name: statistics.median(v) for name, v in times.items()}
    med["ratio"] = (med["mixed"] - med["chunk"]) / med["decode-only"]
    med["spread"] = max((max(v) - min(v)) / statistics.median(v) for v in times.values())
    return med


def mixed_main(args) -> int:
    model = args.model or default_model_path()
    print(f"mixed-step probe: {args.k} decodes + a {args.chunk}-token chunk, threads {args.threads or 'all'}, "
          f"medians of {args.reps} interleaved rounds (ms)")
    rows = [("kv", "flash_attn", "n_ubatch", "kv type", "ctx", "decode-only", "chunk", f"chunk+{args.k} dec",
             "piggyback ratio", "spread")]
    settings = itertools.product([bool(int(u)) for u in args.kv_unified.split(",")], args.flash_attn.split(","),
                                 [int(u) if u != "default" else None for u in args.ubatch.split(",")], args.kv_type.split(","))
    for unified, fa, ubatch, kv_type in settings:
        backend = GGUFBackend.load(model, threads=args.threads, flash_attn=fa, kv_unified=unified, n_ubatch=ubatch,
                                   kv_type=kv_type)
        for ctx in (64, 1024):
            m = mixed_step_probe(backend, args.k, ctx, args.chunk, args.reps)
            rows.append(("unified" if unified else "per-sequence streams", fa, str(backend.n_ubatch), kv_type, str(ctx),
                         *(f"{1000 * m[n]:.1f}" for n in ("decode-only", "chunk", "mixed")),
                         f"{m['ratio']:.2f}", f"{100 * m['spread']:.0f}%"))
            print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
        backend.close()
    _print_table(rows)
    return 0


def _print_table(rows) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        cells = [str(v if v != True else "yes") if v is not False else "NO" for v in row]  # noqa: E712
        print("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", "--model", default=None, help="a .gguf file (default: the shipped SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("-r", "--reps", type=int, default=5, help="pp512 repetitions per side (default: 5)")
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    parser.add_argument("-n", "--n-gen", type=int, default=64, help="tokens generated per request in the decode check")
    parser.add_argument("--mixed", action="store_true", help="run the mixed-step probe instead of the overhead checks")
    parser.add_argument("-k", type=int, default=3, help="--mixed: decoding sequences (default: 3)")
    parser.add_argument("--chunk", type=int, default=64, help="--mixed: prompt chunk tokens (default: 64)")
    parser.add_argument("--flash-attn", default="auto", help="flash attention: on, off, auto, or a comma list for --mixed")
    parser.add_argument("--kv-unified", default="0", help="--mixed: 0 (a KV stream per sequence), 1 (unified), or 0,1")
    parser.add_argument("--ubatch", default="default", help="--mixed: llama.cpp n_ubatch values, a comma list (default: llama.cpp's)")
    parser.add_argument("--kv-type", default="f16", help="--mixed: KV cache types, a comma list of f16, f32, q8_0")


def main(args: argparse.Namespace) -> int:
    if args.mixed:
        return mixed_main(args)

    model = args.model or default_model_path()
    backend = GGUFBackend.load(model, threads=args.threads, flash_attn=args.flash_attn)
    meta = backend.metadata()
    print(f"model {backend.model_name} ({backend.weights}), threads {backend.threads}, "
          f"llama-cpp-python {meta['llama_cpp_python']}, ggml {meta['ggml']}")

    dec = decode_overhead(backend, args.concurrency, 32, args.n_gen, reps=2)
    pp = pp_vs_llama_eval(backend, model, backend.threads, 512, args.reps)

    rows = [
        ("check", "measured", "target", "ok"),
        (f"decode step c={args.concurrency}: harness share of step wall",
         f"{100 * dec['step_overhead']:.2f}% ({dec['ms_per_step']:.2f} ms/step, {dec['ms_in_decode']:.2f} ms in llama_decode, {dec['steps']} steps)",
         "< 3%", dec["step_overhead"] < 0.03),
        (f"decode step c={args.concurrency}: incl. engine loop + strategy",
         f"{100 * dec['loop_overhead']:.2f}%", "(info)", ""),
        ("pp512 c=1: backend / Llama.eval (best of each)",
         f"{pp['ratio_best']:.3f} ({pp['ours_best']:.3f} s vs {pp['theirs_best']:.3f} s; "
         f"{512 / pp['ours_best']:.0f} vs {512 / pp['theirs_best']:.0f} t/s)",
         "within 5%", abs(pp["ratio_best"] - 1) < 0.05),
        ("pp512 c=1: backend / Llama.eval (medians)",
         f"{pp['ratio_median']:.3f} ({pp['ours_median']:.3f} s vs {pp['theirs_median']:.3f} s)", "(info)", ""),
    ]
    _print_table(rows)
    backend.close()
    return 0


if __name__ == "__main__":
    cli.run(__name__)
