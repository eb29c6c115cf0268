"""Every kind of torch-backend step against the device's own limits, measured in one process.

Prints, for one model, dtype and device:
- the device's GEMM peak (best of a few large matmuls) and copy bandwidth;
- pp512 t/s and its ratio to the GEMM roofline (the step's FLOPs at the GEMM peak);
- decode-only steps at 1, 4, 16 sequences and their ratio to the weight-read limit
  (every weight byte read once at the copy bandwidth);
- a chunk step alone, with k decodes added, and the k decodes alone: what the
  piggybacked decodes cost, next to the floor their arithmetic sets;
- a packed step of 4 ragged prompts against their 4 sequential steps;
- plain transformers (SDPA, its own cache) beside the backend where it can run the same step.

All contenders are timed interleaved, rep by rep, so a busy machine slows them alike;
medians, with the spread (max/min - 1) over reps.

    python -m benchmarks.torch.steps [--model PATH | --config llama-1b] [--dtype bfloat16] [--device cuda]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch.backend import DTYPES, TorchBackend
from prefillbench.models import default_model_path
from prefillbench.bench.stats import ci_half_width
from prefillbench.step import DecodeToken, PrefillChunk, Step

from benchmarks.lib import cli
from benchmarks.lib.limits import copy_bandwidth, gemm_peak, hold_freed_memory
from benchmarks.lib.models import CONFIGS, StepCosts, build_from_config
from benchmarks.lib.timing import Clock, Timing, time_interleaved


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="a checkpoint folder or .gguf file (default: the shipped SmolLM2)")
    parser.add_argument("--config", choices=sorted(CONFIGS), help="a random-weight model of these shapes instead")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=512, help="prefill length (pp)")
    parser.add_argument("--context", type=int, default=1024, help="context each decode attends to")
    parser.add_argument("--decodes", default="1,4,16", help="decode-only batch sizes")
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("-k", type=int, default=3, help="decodes piggybacked on the chunk")
    parser.add_argument("--pairs", type=int, default=15,
                        help="further alternations of the chunk, the chunk with k decodes and the k decodes alone, for the piggyback figure")
    parser.add_argument("--ragged", default="100,200,300,400", help="prompt lengths of the packed ragged step")
    parser.add_argument("--no-transformers", action="store_true", help="skip the plain transformers figures")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--no-tune-linear", action="store_true")
    parser.add_argument("--compile", action="store_true", help="CPU: decode-only steps through inductor graphs (~2 min to compile)")
    parser.add_argument("--kernels", default="auto", choices=("auto", "torch"), help="torch: plain torch only (as prefillbench run's)")


def main(args: argparse.Namespace) -> None:
    hold_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else ("cpu" if args.device == "auto" else args.device)
    dtype = DTYPES[args.dtype]
    options = dict(tune_linear=not args.no_tune_linear, kernels=args.kernels)
    if device == "cuda":
        options["cuda_graphs"] = not args.no_cuda_graphs
    if args.compile:
        options["compile_decode"] = True
    if args.config:
        backend = TorchBackend(build_from_config(args.config, dtype, device), f"{args.config} (random weights)", device, **options)
    else:
        backend = TorchBackend.load(args.model or default_model_path(), device=device, dtype=args.dtype, **options)
    dev = backend.torch_device
    clock = Clock(dev)
    sizes = [int(s) for s in args.decodes.split(",")]
    ragged = [int(s) for s in args.ragged.split(",")]
    n_slots = max(max(sizes), args.k + 1, len(ragged))
    max_len = max(args.context + args.chunk, args.prompt, max(ragged)) + 8
    rng = np.random.default_rng(0)

    def prompt(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(0, backend.vocab_size, n))

    backend.prepare(n_slots, max_len, max_len * n_slots)
    # Decodes attend to `context` positions; what the cache holds there does not change a step's cost.
    for s in range(n_slots):
        backend.slots.slot(s)

    def decodes(n: int, first: int = 0) -> tuple[DecodeToken, ...]:
        return tuple(DecodeToken(first + i, 1, args.context) for i in range(n))

    def run(step: Step) -> Callable[[], object]:
        return lambda: backend.execute(step)

    chunk = PrefillChunk(0, prompt(args.chunk), args.context, is_last=False)
    pp = PrefillChunk(0, prompt(args.prompt), 0, is_last=True)
    ragged_chunks = [PrefillChunk(i, prompt(n), 0, is_last=True) for i, n in enumerate(ragged)]
    ours: dict[str, Callable[[], object]] = {f"pp{args.prompt}": run(Step(prefills=(pp,)))}
    ours.update({f"decode x{n}": run(Step(decodes=decodes(n))) for n in sizes})
    ours["chunk"] = run(Step(prefills=(chunk,)))
    ours[f"chunk + {args.k} decodes"] = run(Step(prefills=(chunk,), decodes=decodes(args.k, first=1)))
    ours[f"{args.k} decodes"] = run(Step(decodes=decodes(args.k, first=1)))
    ours["packed ragged"] = run(Step(prefills=tuple(ragged_chunks)))
    ours["ragged one by one"] = lambda: [backend.execute(Step(prefills=(c,))) for c in ragged_chunks]
    longest = max(ragged)
    ours["padded ragged"] = run(Step(prefills=tuple(PrefillChunk(c.seq_id, c.tokens, 0, True, longest - len(c.tokens)) for c in ragged_chunks)))

    contenders = dict(ours)
    if not args.no_transformers:
        contenders.update({f"transformers {k}": v for k, v in transformers_contenders(backend, args, sizes, prompt).items()})

    peak = gemm_peak(dtype, dev, clock, args.reps)
    bandwidth = copy_bandwidth(dev, clock, args.reps)
    times = time_interleaved(contenders, args.reps, clock)
    # The piggyback figure is a difference of ~10 ms between steps of ~400 whose spread is tens of ms: the
    # three steps it rests on get reps of their own, alternated, on top of the table's.
    piggyback_names = ("chunk", f"chunk + {args.k} decodes", f"{args.k} decodes")
    more = time_interleaved({n: ours[n] for n in piggyback_names}, args.pairs, clock) if args.pairs else {}
    piggyback = {n: Timing(times[n].seconds + (more[n].seconds if more else [])) for n in piggyback_names}
    peak_after = gemm_peak(dtype, dev, clock, args.reps)  # the machine may have changed while we ran
    bandwidth_after = copy_bandwidth(dev, clock, args.reps)

    costs = StepCosts.of(backend)
    weight_bytes = costs.weight_bytes
    pp_product_flops = costs.product_flops(args.prompt)
    pp_attention_flops = costs.attention_flops(args.prompt)
    pp_flops = pp_product_flops + pp_attention_flops
    compiled = f", decode-only steps compiled ({backend.metadata()['compile']})" if args.compile else ""
    print(f"# {backend.model_name}, {args.dtype} on {backend.label}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"{args.reps} interleaved reps{compiled}")
    meta = backend.metadata()
    print("# kernels " + "; ".join(f"{k}: {meta[k]}" for k in ("kernels", "kernel_build", "prefill_attention", "decode_attention",
                                                              "layer_ops", "decode_plan", "tune_linear") if k in meta))
    # A limit measured low is the machine's noise, not its capability: a ratio against it would flatter the step.
    low_peak, low_bandwidth = min(peak, peak_after), min(bandwidth, bandwidth_after)
    peak, bandwidth = max(peak, peak_after), max(bandwidth, bandwidth_after)
    print(f"GEMM peak {peak / 1e9:.1f} GFLOP/s, copy bandwidth {bandwidth / 1e9:.1f} GB/s (the higher of before and after the run: "
          f"{low_peak / 1e9:.1f} GFLOP/s and {low_bandwidth / 1e9:.1f} GB/s in the other); "
          f"weights read per decode step {weight_bytes / 1e6:.0f} MB -> weight-read limit {weight_bytes / bandwidth * 1e3:.2f} ms")
    print()
    print("| step | backend ms | t/s | vs limit | transformers ms | t/s | spread (backend) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")

    def row(name: str, tokens: int, limit_s: float | None) -> None:
        t = times[name].median
        other = times.get(f"transformers {name}")
        vs = f"{limit_s / t:.2f}" if limit_s else "-"
        theirs = f"{other.median * 1e3:.1f} | {tokens / other.median:.1f}" if other else "- | -"
        print(f"| {name} | {t * 1e3:.1f} | {tokens / t:.1f} | {vs} | {theirs} | {times[name].spread:.0%} |")

    row(f"pp{args.prompt}", args.prompt, pp_flops / peak)
    for n in sizes:
        row(f"decode x{n}", n, weight_bytes / bandwidth)
    row("chunk", args.chunk, None)
    row(f"chunk + {args.k} decodes", args.chunk + args.k, None)
    row(f"{args.k} decodes", args.k, weight_bytes / bandwidth)
    for name in ("packed ragged", "ragged one by one", "padded ragged"):
        row(name, sum(ragged), None)
    t_chunk, t_mixed, t_dec = (piggyback[n].median for n in piggyback_names)
    marginal = t_mixed - t_chunk
    floor_arith = 2 * args.k * costs.body / peak
    floor_head = costs.head * costs.elt / bandwidth
    # Each decode reads its own K/V in a chunk step as in a step of its own: piggybacking shares weights, not caches.
    floor_kv = costs.kv_bytes(args.k, args.context) / bandwidth
    floor = floor_arith + floor_head + floor_kv
    print()
    print(f"pp{args.prompt}: {times[f'pp{args.prompt}'].median / (pp_flops / peak):.2f}x the GEMM roofline time "
          f"(roofline {pp_flops / peak * 1e3:.0f} ms; ratio roofline/measured {pp_flops / peak / times[f'pp{args.prompt}'].median:.2f})")
    n_reps = len(piggyback["chunk"].seconds)
    print(f"piggyback ({n_reps} reps: the table's {args.reps} and {args.pairs} more of these three steps alone): "
          f"(chunk + {args.k} decodes) - chunk = {marginal * 1e3:.1f} ms = {marginal / t_dec:.2f} x ({args.k} decodes alone, {t_dec * 1e3:.1f} ms)")
    # The two chunk steps run back to back in every rep: their difference within a rep is spared the drift
    # between reps, which on a shared machine is larger than the difference itself.
    paired = piggyback[f"chunk + {args.k} decodes"].paired_differences(piggyback["chunk"])
    q1, mid, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (paired[0],) * 3
    mean, half = statistics.fmean(paired), ci_half_width(paired) if len(paired) > 1 else float("nan")
    print(f"  paired within each rep: median {mid * 1e3:.1f} ms = {mid / t_dec:.2f} x the decodes alone "
          f"(interquartile {q1 / t_dec:.2f} to {q3 / t_dec:.2f}; mean {mean / t_dec:.2f} +- {half / t_dec:.2f}, 95% CI)")
    print(f"  its floor: {args.k} rows of arithmetic at the GEMM peak {floor_arith * 1e3:.1f} ms + one LM-head weight read "
          f"{floor_head * 1e3:.1f} ms (the chunk alone emits no token) + the decodes' K/V at {args.context} positions "
          f"{floor_kv * 1e3:.1f} ms = {floor * 1e3:.1f} ms = {floor / t_dec:.2f} x the decodes alone")
    print(f"packed ragged step ({'+'.join(map(str, ragged))}): {times['packed ragged'].median / times['ragged one by one'].median:.2f}x "
          f"the time of the {len(ragged)} prompts one step each; padded to {longest}: {times['padded ragged'].median / times['packed ragged'].median:.2f}x packed")
    if dev.type == "cpu":  # on CUDA the profiler's CPU times are launch times
        print_profile(f"pp{args.prompt}", ours[f"pp{args.prompt}"], pp_product_flops, pp_attention_flops, peak)
    if backend.linear_kernels.choice:
        print("linear kernels chosen:", ", ".join(f"{k} {v}" for k, v in backend.linear_kernels.summary().items()))


#: Profiler op names by part of a step: the products of the linear layers, and attention.
PRODUCT_OPS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::linear")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
                 "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention")


def print_profile(name: str, step: Callable[[], object], product_flops: float, attention_flops: float, peak: float) -> None:
    """Where one step's time goes (one profiled run, CPU op self times): products, attention, the rest."""
    from torch.profiler import ProfilerActivity, profile

    step()
    # The compiled C kernels are not torch ops, so the profiler does not see them: they are timed here, each
    # counted in its part of the step.
    c_calls = [(cpu_layer_ops, n, "compiled C loops") for n in ("add_rms_norm", "rotary_", "silu_mul")] + [
        (cpu_decode_attention, "decode_attention", "attention"), (cpu_prefill_attention, "prefill_attention", "attention"),
        (cpu_few_rows, "multiply", "products")]
    parts = {"products": 0.0, "attention": 0.0, "other ops": 0.0, "compiled C loops": 0.0}
    originals = [getattr(module, n) for module, n, _ in c_calls]

    def timed(fn: Callable, part: str) -> Callable:
        def call(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                parts[part] += time.perf_counter() - t0
        return call

    for (module, n, part), fn in zip(c_calls, originals):
        setattr(module, n, timed(fn, part))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            step()
            wall = time.perf_counter() - t0
    finally:
        for (module, n, _), fn in zip(c_calls, originals):
            setattr(module, n, fn)
    for event in prof.key_averages():
        part = "products" if event.key in PRODUCT_OPS else "attention" if event.key in ATTENTION_OPS else "other ops"
        parts[part] += event.self_cpu_time_total / 1e6
    gaps = wall - sum(parts.values())
    print(f"{name} profiled (one run, {wall * 1e3:.0f} ms under the profiler): products {parts['products'] * 1e3:.0f} ms "
          f"({product_flops / parts['products'] / 1e9:.0f} GFLOP/s, {product_flops / parts['products'] / peak:.2f} of the peak); "
          f"attention {parts['attention'] * 1e3:.0f} ms ({attention_flops / max(parts['attention'], 1e-9) / 1e9:.0f} GFLOP/s, "
          f"{attention_flops / max(parts['attention'], 1e-9) / peak:.2f} of the peak); other ops {parts['other ops'] * 1e3:.0f} ms; "
          f"compiled C loops {parts['compiled C loops'] * 1e3:.0f} ms; between ops {gaps * 1e3:.0f} ms")


def transformers_contenders(backend: TorchBackend, args, sizes: list[int], prompt) -> dict[str, Callable[[], object]]:
    """The stock model as transformers runs it (SDPA, DynamicCache), on the steps it can express."""
    from transformers import DynamicCache

    model, dev = backend.model, backend.torch_device
    cfg = model.config.get_text_config()
    kv_shape = lambda b: (b, backend.kv_heads, args.context, backend.head_dim)  # noqa: E731

    def stock(fn: Callable[[], object]) -> Callable[[], object]:
        @torch.inference_mode()
        def call():
            model.config._attn_implementation = "sdpa"
            linears = [(m, m.__dict__.pop("forward")) for m in model.modules() if "forward" in m.__dict__]
            try:
                return fn()
            finally:
                for m, f in linears:
                    m.forward = f
                model.config._attn_implementation = "prefillbench"
        return call

    ids = torch.tensor([prompt(args.prompt)], device=dev)
    out = {f"pp{args.prompt}": stock(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))}
    for b in sizes:
        cache = DynamicCache(config=cfg)
        for layer in range(backend.n_layers):
            cache.update(torch.zeros(kv_shape(b), dtype=backend.dtype, device=dev),
                         torch.zeros(kv_shape(b), dtype=backend.dtype, device=dev), layer)
        tokens = torch.ones((b, 1), dtype=torch.long, device=dev)
        positions = torch.full((b, 1), args.context, device=dev)

        def decode(cache=cache, tokens=tokens, positions=positions):
            model(input_ids=tokens, position_ids=positions, cache=cache, use_cache=True)
            cache.crop(-1)  # back to `context` positions for the next rep

        out[f"decode x{b}"] = stock(decode)
    return out


if __name__ == "__main__":
    cli.run(__name__)
