"""n-gram speculative decoding on the shipped model: tokens/s and TBT with drafting against without, at c=1.

Two workloads that repeat their input (a code edit: the prompt holds code the answer rewrites; a summary that
quotes its source) and one that does not (a story). Each round runs every workload without drafting and with each
--spec, alternated, on the same backend; printed per round and as the median over rounds: output tokens/s, mean
TPOT and TBT p50/p99 (every token of a verify step is stamped at the step's end, as a streaming client sees them:
docs/speculative-decoding.md: one gap per step, as vLLM's ITL), the acceptance rate and tokens per decode step, and the ratio of tokens/s over the
run without drafting. Greedy tokens are checked identical with and without drafting, every run.

    python -m benchmarks.gguf.spec_ngram [--backend gguf|torch] [--spec ngram:3,ngram:5] [--rounds 3] [--gen 128]
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from strategies import make_strategy

from prefillbench import engine
from prefillbench.backends import load_backend
from prefillbench.models import default_model_path
from prefillbench.sequence import Request
from prefillbench.speculation import parse_spec

from benchmarks.lib import cli

CODE = '''def moving_average(values, window):
    """The mean of every `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    sums = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            sums.append(total / window)
    return sums
'''
SOURCE = ("The city council met on Tuesday to discuss the new bus routes. The council agreed that the number 12 bus "
          "will run every ten minutes from March, and that the number 4 bus will stop at the hospital. The council "
          "also said that tickets will cost the same as last year.")
#: (name, text, repetitive): the prompt is the text as the chat template would not change which n-grams recur.
WORKLOADS = (
    ("code edit", "<|im_start|>user\nRename `values` to `data` in this function and give the whole function:\n"
                  f"```python\n{CODE}```<|im_end|>\n<|im_start|>assistant\n```python\n", True),
    ("summary quoting", f"<|im_start|>user\n{SOURCE}\nRepeat the council's decisions word for word.<|im_end|>\n"
                        "<|im_start|>assistant\nThe council agreed that", True),
    ("story", "<|im_start|>user\nWrite a short story about a lighthouse keeper who finds a map.<|im_end|>\n"
              "<|im_start|>assistant\n", False),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="gguf", choices=("gguf", "torch"))
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--spec", default="ngram:3", help="drafting settings to time against none, comma-separated")
    parser.add_argument("--strategy", default="vllm-v1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gen", type=int, default=128, help="tokens generated per request")


def tokenize(texts: list[str]) -> list[tuple[int, ...]]:
    from llama_cpp import Llama

    vocab = Llama(model_path=default_model_path(), vocab_only=True, verbose=False)
    out = [tuple(vocab.tokenize(t.encode(), add_bos=False, special=True)) for t in texts]
    vocab.close()
    return out


def figures(run) -> dict:
    req = run.requests[0]
    times = np.asarray(req.token_times)
    gaps = 1000 * np.diff(times)
    gaps = gaps[gaps > 0]  # a verify step's tokens arrive together: one gap, as the rows' TBT (vLLM's ITL) counts
    decoded = len(req.tokens) - 1
    return {"tok/s": decoded / (times[-1] - times[0]), "TPOT ms": 1000 * (times[-1] - times[0]) / decoded,
            "TBT p50 ms": float(np.percentile(gaps, 50)), "TBT p99 ms": float(np.percentile(gaps, 99)),
            "accept": req.accepted / req.drafted if req.drafted else float("nan"),
            "t/step": decoded / req.decode_steps if req.decode_steps else 1.0}


def main(args: argparse.Namespace) -> None:
    backend = load_backend(args.backend, None, threads=args.threads)
    prompts = tokenize([text for _, text, _ in WORKLOADS])
    settings = ["off", *[s for s in args.spec.split(",") if s]]
    runs: dict[tuple[str, str], list[dict]] = {}
    for name, prompt in zip([w[0] for w in WORKLOADS], prompts):  # warm-up, untimed
        engine.run(backend, make_strategy(args.strategy, 256), [Request(prompt, 4)], 1)
    for rnd in range(args.rounds):
        for (name, _, _), prompt in zip(WORKLOADS, prompts):
            tokens = None
            order = settings if rnd % 2 == 0 else settings[::-1]  # alternated: drift favours neither
            for setting in order:
                strategy = make_strategy(args.strategy, 256, parse_spec(setting))
                run = engine.run(backend, strategy, [Request(prompt, args.gen)], 1)
                if tokens is None:
                    tokens = run.requests[0].tokens
                elif run.requests[0].tokens != tokens:
                    raise SystemExit(f"{name}: {setting} changed the greedy tokens")
                f = figures(run)
                runs.setdefault((name, setting), []).append(f)
                print(f"round {rnd} {name:>16} {setting:>8}: " + ", ".join(f"{k} {v:.2f}" for k, v in f.items()),
                      flush=True)
    print(f"\nmedian over {args.rounds} rounds ({args.backend}, {args.strategy}, c=1, {args.gen} tokens):")
    for name, _, repetitive in WORKLOADS:
        base = statistics.median(f["tok/s"] for f in runs[(name, "off")])
        for setting in settings:
            fs = runs[(name, setting)]
            med = {k: statistics.median(f[k] for f in fs) for k in fs[0]}
            print(f"{name:>16} ({'repetitive' if repetitive else 'not repetitive'}) {setting:>8}: "
                  f"{med['tok/s']:.1f} tok/s = {med['tok/s'] / base:.2f}x off; TPOT {med['TPOT ms']:.1f} ms, "
                  f"TBT p50 {med['TBT p50 ms']:.1f} / p99 {med['TBT p99 ms']:.1f} ms; "
                  f"acceptance {med['accept']:.2f}, {med['t/step']:.2f} tokens/step")


if __name__ == "__main__":
    cli.run(__name__)
