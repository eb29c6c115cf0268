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

    python benchmarks/torch_steps.py [--model PATH | --config llama-1b] [--dtype bfloat16] [--device cuda]
"""
from __future__ import annotations

import argparse
import ctypes
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from prefillbench.backends.torch.cpu import decode_attention as cpu_decode_attention
from prefillbench.backends.torch.cpu import few_rows as cpu_few_rows
from prefillbench.backends.torch.cpu import layer_ops as cpu_layer_ops
from prefillbench.backends.torch.cpu import prefill_attention as cpu_prefill_attention
from prefillbench.backends.torch.backend import DTYPES, TorchBackend
from prefillbench.backends.torch.linear import KERNELS, TunedWeight, onednn_applies
from prefillbench.models import default_model_path
from prefillbench.bench.stats import ci_half_width
from prefillbench.step import DecodeToken, PrefillChunk, Step

#: Random-weight models built from a config, for devices with no model on disk (GPU checks).
CONFIGS = {
    # Llama-3.2-1B's shapes.
    "llama-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                     tie_word_embeddings=True, rope_theta=500000.0),
    # Llama-3.1-8B's shapes.
    "llama-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                     tie_word_embeddings=False, rope_theta=500000.0),
    # SmolLM2-135M's shapes (the default model), for a quick run without its file.
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                         tie_word_embeddings=True),
}


def build_from_config(name: str, dtype: torch.dtype, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(CONFIGS[name])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0


@dataclass
class Timing:
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        return max(self.seconds) / min(self.seconds) - 1

    def paired_ratio(self, other: "Timing") -> float:
        """The median of this time over `other`'s, rep by rep: each pair ran back to back, so the
        machine's drift between reps, often larger than the difference, cancels."""
        ratios = sorted(a / b for a, b in zip(self.seconds, other.seconds))
        return ratios[len(ratios) // 2]


def time_interleaved(contenders: dict[object, Callable[[], object]], reps: int, clock: Clock) -> dict[object, Timing]:
    for fn in contenders.values():
        clock(fn)  # warm-up: allocations, kernel choices, graph captures
    out = {name: Timing([]) for name in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            out[name].seconds.append(clock(fn))
    return out


def time_both_ways(run: Callable[[object, bool], object], cases: dict, reps: int, clock: Clock) -> dict[object, tuple[Timing, Timing]]:
    """Each case run with a switch on and off (`run(case, on)`), all alternated rep by rep: {name: (on, off)}."""
    contenders = {(name, on): (lambda case=case, on=on: run(case, on)) for name, case in cases.items() for on in (True, False)}
    times = time_interleaved(contenders, reps, clock)
    return {name: (times[(name, True)], times[(name, False)]) for name in cases}


def logit_column(run: Callable[..., object], cases: dict) -> tuple[str, dict[object, str]]:
    """print_both_ways' extra column: each case's largest |logit| difference between run(case, True, logits=True)
    and run(case, False, logits=True)."""
    diffs = {}
    for name, case in cases.items():
        on, off = (run(case, way, logits=True).logits for way in (True, False))
        diffs[name] = f"{max(float(np.abs(on[s] - off[s]).max()) for s in on):.1e}"
    return "logits max abs diff", diffs


def print_both_ways(times: dict[object, tuple[Timing, Timing]], case: str, on: str, off: str,
                    extra: tuple[str, dict[object, str]] | None = None) -> None:
    """time_both_ways' result as a table: each way's median, their ratio, the paired median of the ratios,
    and an optional column of the caller's ((header, {case: text}))."""
    head = f"| {case} | {on} ms | {off} ms | {on} / {off} (medians) | paired median |"
    print(head + (f" {extra[0]} |" if extra else ""))
    print("| --- | ---: | ---: | ---: | ---: |" + (" ---: |" if extra else ""))
    for name, (a, b) in times.items():
        row = f"| {name} | {a.median * 1e3:.1f} | {b.median * 1e3:.1f} | {a.median / b.median:.3f} | {a.paired_ratio(b):.3f} |"
        print(row + (f" {extra[1][name]} |" if extra else ""))


def default_backend(dtype: str, n_slots: int, max_len: int, **options) -> TorchBackend:
    """The default model on the CPU, prepared for `n_slots` sequences of `max_len` positions, every slot held
    (slot i for sequence i), as the benchmarks that time single steps set it up; `options` as TorchBackend.load's."""
    backend = TorchBackend.load(default_model_path(), device="cpu", dtype=dtype, **options)
    backend.prepare(n_slots, max_len, max_len * n_slots)
    for s in range(n_slots):
        backend.slots.slot(s)
    return backend


def switched_run(backend: TorchBackend, switch: Callable[[bool], None]) -> Callable[..., object]:
    """run(step, on, logits=False) for time_both_ways: the backend's step with `switch(on)` applied, and
    `switch(True)` again after it, whatever happened."""

    def run(step: Step, on: bool, logits: bool = False):
        switch(on)
        try:
            return backend.execute(step, return_logits=logits)
        finally:
            switch(True)

    return run


def kernel_switch(backend: TorchBackend, kernel) -> Callable[..., object]:
    """switched_run with the C kernel module `kernel` as it is (on), or with its applies() refusing every call,
    so the step takes the kernel's fallback (off)."""
    applies = kernel.applies

    def switch(on: bool) -> None:
        kernel.applies = applies if on else (lambda *a: False)

    return switched_run(backend, switch)


def both_ways_arguments(description: str, context_help: str) -> argparse.Namespace:
    """The flags of the scripts that time one switch both ways on the default model (--dtype, --reps,
    --threads, --context), parsed, with torch's thread count set."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=1024, help=context_help)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return args


def gemm_peak(dtype: torch.dtype, device: torch.device, clock: Clock, reps: int) -> float:
    """FLOP/s: the best of a few large square matmuls, through every GEMM library the backend may use
    (on the CPU, MKL's `torch.mm` and oneDNN's product with a prepacked weight: the roofline is the
    device's, not one library's)."""
    sizes = (4096, 8192) if device.type == "cuda" else (1024, 2048)
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        products = {"mm": lambda: torch.mm(a, b)}
        if onednn_applies(b):
            weight = TunedWeight(b, None)  # a @ b.T: the same FLOPs as a @ b
            products["onednn"] = lambda: KERNELS["onednn_packed"](a, weight)
        for timing in time_interleaved(products, reps, clock).values():
            best = max(best, 2 * n**3 / min(timing.seconds))
    return best


def copy_bandwidth(device: torch.device, clock: Clock, reps: int) -> float:
    """Bytes/s moved (read + write) by a large tensor copy, far larger than any cache."""
    n = (1 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.ones(n // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = min(time_interleaved({"copy": lambda: dst.copy_(src)}, reps, clock)["copy"].seconds)
    return 2 * n / t


def matmul_params(model) -> tuple[int, int]:
    """(weights of all linear layers but the LM head, LM head weights): what a token multiplies by."""
    head = model.get_output_embeddings()
    body = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


def hold_freed_memory() -> None:
    """Keep glibc from handing large freed blocks back to the OS between steps.

    A step allocates its activations afresh. glibc returns large frees to the OS by a threshold that
    adapts to what was freed before, so in this script's mix of step kinds (which a CLI run does not
    have) the packed ragged step took 36,000-56,000 page faults a step, each 4 KB page faulted in and
    zeroed by the kernel (0.8 us a page measured here), where after a 1,024-token prompt it took none;
    three alternated pairs of processes put that step at 0.90-0.96x its time with freed memory held.
    A CLI run of the default preset faulted as often either way (558 and 554 thousand, nearly all
    loading), so holding memory here makes the steps cost what they cost in a run."""
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: glibc's largest; bigger blocks are mapped anyway
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = parser.parse_args()
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

    body, head = matmul_params(backend.model)
    cfg = backend.model.config.get_text_config()
    width = backend.head_dim * cfg.num_attention_heads
    elt = torch.finfo(dtype).bits // 8
    weight_bytes = (body + head) * elt
    pp_product_flops = 2 * args.prompt * body + 2 * head
    pp_attention_flops = 2 * backend.n_layers * width * args.prompt**2  # causal attention: QK and PV, half each
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
    floor_arith = 2 * args.k * body / peak
    floor_head = head * elt / bandwidth
    # Each decode reads its own K/V in a chunk step as in a step of its own: piggybacking shares weights, not caches.
    floor_kv = args.k * backend.n_layers * 2 * backend.kv_heads * args.context * backend.head_dim * elt / bandwidth
    floor = floor_arith + floor_head + floor_kv
    print()
    print(f"pp{args.prompt}: {times[f'pp{args.prompt}'].median / (pp_flops / peak):.2f}x the GEMM roofline time "
          f"(roofline {pp_flops / peak * 1e3:.0f} ms; ratio roofline/measured {pp_flops / peak / times[f'pp{args.prompt}'].median:.2f})")
    n_reps = len(piggyback["chunk"].seconds)
    print(f"piggyback ({n_reps} reps: the table's {args.reps} and {args.pairs} more of these three steps alone): "
          f"(chunk + {args.k} decodes) - chunk = {marginal * 1e3:.1f} ms = {marginal / t_dec:.2f} x ({args.k} decodes alone, {t_dec * 1e3:.1f} ms)")
    # The two chunk steps run back to back in every rep: their difference within a rep is spared the drift
    # between reps, which on a shared machine is larger than the difference itself.
    paired = [m - c for c, m in zip(piggyback["chunk"].seconds, piggyback[f"chunk + {args.k} decodes"].seconds)]
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
    main()
