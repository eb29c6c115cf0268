"""Regenerate the shipped attention and network samples (measured/data/vidur_a100_attention.csv, vidur_network.csv)
from Vidur.

The attention sample is what attention.sample_frame keeps of microsoft/vidur's data/profiling/a100/attention.csv at
e2d00e9 (the file is gone from later commits); the network sample is what collectives.sample_frame keeps of
data/profiling/network/<node>/{all_reduce,send_recv}.csv at main 7d47513. Give a bare (or any) git directory
(--git), read with `git show` at those commits, or the two files' folders (--attention FILE, --network DIR).
--check compares instead of writing and exits 1 where a sample differs.

    python -m benchmarks.sim.make_attn_net_samples --git /work/.mirror/microsoft+vidur/repo
    python -m benchmarks.sim.make_attn_net_samples --git /work/.mirror/microsoft+vidur/repo --check
"""
from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pandas as pd

from prefillbench.backends.sim.measured import attention, collectives, profiles

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--git", help="a Vidur git directory (bare or not)")
    parser.add_argument("--attention", help="Vidur's attention.csv (or a checkout at e2d00e9) instead of --git")
    parser.add_argument("--network", help="a Vidur checkout (or its data/profiling/network folder) instead of --git")
    parser.add_argument("--out", default=str(attention.DATA_DIR), help="where to write the samples")
    parser.add_argument("--check", action="store_true", help="compare with the samples in --out, write nothing")


def _show(git_dir: str, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "-C", git_dir, "show", f"{commit}:{path}"], capture_output=True, check=True).stdout


def from_git(git_dir: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    att = attention.sample_frame(pd.read_csv(io.BytesIO(_show(git_dir, attention.ATTENTION_COMMIT,
                                                                attention.ATTENTION_PATH))))
    names = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", "--name-only", profiles.VIDUR_COMMIT,
                            collectives.VIDUR_NETWORK], capture_output=True, text=True, check=True).stdout.split()
    frames = {}
    for name in names:
        node, file = name.split("/")[-2:]
        coll = file.removesuffix(".csv")
        if node in collectives.NODES and coll in collectives.MEASURED:
            frames[(node, coll)] = pd.read_csv(io.BytesIO(_show(git_dir, profiles.VIDUR_COMMIT, name)))
    return att, collectives.sample_frame(frames)


def main(args: argparse.Namespace) -> int:
    if args.git:
        att, net = from_git(args.git)
    elif args.attention and args.network:
        att, net = attention.read_vidur(args.attention), collectives.read_vidur(args.network)
    else:
        raise SystemExit("give --git DIR, or both --attention and --network")
    differ = 0
    for df, name, read, write in ((att, attention.SAMPLE.name, attention.read_sample, attention.write_sample),
                                  (net, collectives.SAMPLE.name, collectives.read_sample, collectives.write_sample)):
        target = Path(args.out) / name
        if args.check:
            same = target.exists() and read(target).equals(df)
            differ += not same
            print(f"{target}: {'same' if same else 'DIFFERS'} ({len(df)} rows)")
            continue
        write(df, target)
        print(f"{target}: {len(df)} rows, {target.stat().st_size / 1024:.0f} KiB")
    return 1 if differ else 0


if __name__ == "__main__":
    cli.run(__name__)
