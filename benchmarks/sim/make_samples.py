"""Regenerate the shipped Vidur samples (prefillbench/backends/sim/measured/data/vidur_<gpu>_mlp.csv) from a Vidur checkout.

The samples are what profiles.sample_frame keeps of microsoft/vidur's data/profiling/compute/<gpu>/*/*/mlp.csv at
main 7d47513: per model, TP and token count of profiles.TOKEN_GRID, each operator's median and std. Give a
checkout's work tree (--vidur), or a bare clone and a commit (--git, --commit), whose mlp.csv files are read with
`git show` (the attention files beside them are too large to be stored there). --check compares instead of writing
and exits 1 where a sample differs.

    python -m benchmarks.sim.make_samples --vidur ~/src/vidur
    python -m benchmarks.sim.make_samples --git /work/.mirror/microsoft+vidur/repo --check
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from prefillbench.backends.sim.measured import profiles

from benchmarks.lib import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vidur", help="a Vidur checkout (work tree)")
    parser.add_argument("--git", help="a Vidur git directory (bare or not), read at --commit")
    parser.add_argument("--commit", default=profiles.VIDUR_COMMIT)
    parser.add_argument("--out", default=str(profiles.DATA_DIR), help="where to write the samples")
    parser.add_argument("--gpus", default=",".join(profiles.GPUS))
    parser.add_argument("--check", action="store_true", help="compare with the samples in --out, write nothing")


def extract(git_dir: str, commit: str, dest: Path) -> Path:
    """Copy the commit's compute mlp.csv files under dest, as a checkout holds them."""
    names = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", "--name-only", commit, profiles.VIDUR_COMPUTE],
                           capture_output=True, text=True, check=True).stdout.split()
    for name in (n for n in names if n.endswith("/mlp.csv")):
        data = subprocess.run(["git", "-C", git_dir, "show", f"{commit}:{name}"], capture_output=True, check=True).stdout
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return dest


def main(args: argparse.Namespace) -> int:
    if bool(args.vidur) == bool(args.git):
        raise SystemExit("give one of --vidur PATH or --git DIR")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.vidur) if args.vidur else extract(args.git, args.commit, Path(tmp))
        differ = 0
        for gpu in args.gpus.split(","):
            df = profiles.read_vidur(root, gpu)
            target = Path(args.out) / profiles.sample_path(gpu).name
            if args.check:
                same = target.exists() and profiles.read_sample(target).equals(df)
                differ += not same
                print(f"{target}: {'same' if same else 'DIFFERS'} ({len(df)} rows)")
                continue
            profiles.write_sample(df, target, gpu)
            print(f"{target}: {len(df)} rows of {df['model'].nunique()} models, {target.stat().st_size / 1024:.0f} KiB")
    return 1 if differ else 0


if __name__ == "__main__":
    cli.run(__name__)
