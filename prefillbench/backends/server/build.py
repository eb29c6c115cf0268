"""llama.cpp's own tools (llama-server, llama-bench), built from the exact llama.cpp the gguf backend runs.

The sdist of the installed llama-cpp-python holds all of its vendored llama.cpp (tools/ included). This
module downloads that sdist with pip (the package registry only), unpacks it into a cache folder,
`~/.cache/prefillbench/llama.cpp-<version>/` (or $PREFILLBENCH_CACHE/llama.cpp-<version>/), and builds
the two tools with CMake, offline:

* the configuration llama-cpp-python's wheel is built with, for the same kernels as the backend: Release,
  shared libraries, ggml's defaults (GGML_NATIVE on: -march=native, OpenMP on; no backend forced), and
  CMAKE_ARGS from the environment when set, as pip passed it to the wheel's build;
* plus what a tools build needs offline: the server on, tests and examples off, no prebuilt web UI
  (its download goes to a host out of reach), no OpenSSL, no CURL.

After the build the CPU features of the built ggml are compared with those of the installed wheel's
(`llama_print_system_info`), and a difference is an error: the tools would not run the backend's kernels.

Usage: python -m prefillbench.backends.server.build [--jobs N] [--sdist FILE.tar.gz] [--check] (`make server`)
From code: `llama_tool("llama-server") -> Path` builds on first use (a line says so, with the build's progress)
and returns the cached binary after.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path


PACKAGE = "llama-cpp-python"
TOOLS = ("llama-bench", "llama-server")
#: What a tools build adds to the wheel's own configuration (the sdist's CMakeLists.txt and pyproject.toml).
TOOL_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",  # scikit-build-core's default build type for the wheel
    "-DBUILD_SHARED_LIBS=ON",  # as the wheel: libllama.so, libggml*.so
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # else it downloads the UI from a host out of reach
    "-DLLAMA_OPENSSL=OFF",  # this llama.cpp's option (vendor/cpp-httplib/CMakeLists.txt)
    "-DLLAMA_BUILD_BORINGSSL=OFF",
    "-DLLAMA_CURL=OFF",  # deprecated and ignored by this llama.cpp, set off all the same (the wheel forces it off)
)


def installed_version() -> str:
    return metadata.version(PACKAGE)


def cache_root() -> Path:
    base = os.environ.get("PREFILLBENCH_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "prefillbench"


def tool_dir(version: str | None = None) -> Path:
    return cache_root() / f"llama.cpp-{version or installed_version()}"


def cmake_flags() -> list[str]:
    """The configure flags: the tools' own, then CMAKE_ARGS as the wheel's build would have taken them."""
    return [*TOOL_FLAGS, *shlex.split(os.environ.get("CMAKE_ARGS", ""))]


@contextmanager
def _locked(folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _log(msg: str) -> None:
    print(f"prefillbench: {msg}", file=sys.stderr, flush=True)


def fetch_source(folder: Path, version: str, sdist: Path | None = None) -> Path:
    """The sdist's llama.cpp source tree (vendor/llama.cpp), downloaded and unpacked once."""
    src = folder / f"llama_cpp_python-{version}"
    llama_src = src / "vendor" / "llama.cpp"
    if (llama_src / "CMakeLists.txt").is_file():
        return llama_src
    dl = folder / "sdist"
    archives = [sdist] if sdist else sorted(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not archives:
        _log(f"downloading the {PACKAGE} {version} sdist (pip prepares its metadata too: a minute or two)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"{PACKAGE}=={version}", "-d", str(dl)], check=True)
        archives = sorted(dl.glob(f"llama_cpp_python-{version}.tar.gz"))
        if not archives:
            raise RuntimeError(f"pip download left no llama_cpp_python-{version}.tar.gz in {dl}")
    _log(f"unpacking {archives[0]}")
    tmp = folder / "unpack.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archives[0]) as tar:
        tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
    shutil.rmtree(src, ignore_errors=True)
    (tmp / src.name).rename(src)
    shutil.rmtree(tmp, ignore_errors=True)
    if not (llama_src / "CMakeLists.txt").is_file():
        raise RuntimeError(f"the sdist holds no vendor/llama.cpp: {src}")
    return llama_src


def build(jobs: int = 2, version: str | None = None, sdist: Path | None = None, force: bool = False) -> dict:
    """Configure and build TOOLS (niced) unless the cache already holds them for the same flags; returns the stamp."""
    version = version or installed_version()
    folder = tool_dir(version)
    with _locked(folder):
        stamp_file = folder / "build.json"
        flags = cmake_flags()
        if not force and stamp_file.is_file():
            stamp = json.loads(stamp_file.read_text())
            if (stamp.get("flags") == flags and all(Path(p).is_file() for p in stamp["tools"].values())
                    and stamp.get("cpu_features") == wheel_features()):  # a cache carried to another CPU: rebuilt
                return stamp
        llama_src = fetch_source(folder, version, sdist)
        bdir = folder / "build"
        if force or (bdir / "CMakeCache.txt").is_file() and not stamp_file.is_file():
            shutil.rmtree(bdir, ignore_errors=True)  # a half-made or forced build starts over
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        t0 = time.perf_counter()
        _log(f"configuring {llama_src} -> {bdir}")
        subprocess.run([*nice, "cmake", "-S", str(llama_src), "-B", str(bdir), *generator, *flags], check=True,
                       stdout=subprocess.DEVNULL)
        t1 = time.perf_counter()
        _log(f"building {', '.join(TOOLS)} from {PACKAGE} {version}'s llama.cpp with {jobs} job(s), once "
             f"(a few minutes; cached in {folder}; log: {folder / 'build.log'})")
        _build_with_progress([*nice, "cmake", "--build", str(bdir), "--target", *TOOLS, "-j", str(jobs)],
                             folder / "build.log")
        t2 = time.perf_counter()
        tools = {name: str(bdir / "bin" / name) for name in TOOLS}
        for name, path in tools.items():
            if not Path(path).is_file():
                raise RuntimeError(f"the build made no {name} at {path}")
        stamp = {"version": version, "flags": flags, "tools": tools, "configure_s": round(t1 - t0, 1),
                 "build_s": round(t2 - t1, 1), "jobs": jobs, "built_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        features = compare_features(bdir / "bin")
        stamp["cpu_features"] = features["built"]
        if features["built"] != features["wheel"]:
            raise RuntimeError("the built ggml's CPU features differ from the installed wheel's:\n"
                               f"  wheel: {features['wheel']}\n  built: {features['built']}\n"
                               "set CMAKE_ARGS as when llama-cpp-python was installed, then rebuild with --force")
        stamp_file.write_text(json.dumps(stamp, indent=2) + "\n")
        return stamp


def _build_with_progress(argv: list[str], log_path: Path) -> None:
    """Run the build with its output in `log_path`, its [n/N] progress on one line of stderr."""
    import re

    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            step = re.match(r"\[(\d+)/(\d+)\]", line) or re.match(r"\[\s*(\d+)%\]", line)
            if step and sys.stderr.isatty():
                print(f"\rprefillbench: building {step.group(0)}", end="", file=sys.stderr, flush=True)
        proc.wait()
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if proc.returncode:
        tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-8:])
        raise RuntimeError(f"the llama.cpp build failed (exit {proc.returncode}); {log_path} ends: {tail}")


def llama_tool(name: str, jobs: int = 2) -> Path:
    """The path of a llama.cpp tool (llama-bench, llama-server) built from the installed llama-cpp-python's
    source; built on first use (minutes), cached after."""
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}; built: {', '.join(TOOLS)}")
    return Path(build(jobs)["tools"][name])


_SYSTEM_INFO = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.llama_backend_init(); "
                "lib.llama_print_system_info.restype = ctypes.c_char_p; print(lib.llama_print_system_info().decode())")


def _features(system_info: str) -> str:
    """The CPU part of llama_print_system_info: 'SSE3 = 1 | ... | REPACK = 1'."""
    cpu = [part for part in system_info.split("CPU :", 1)[-1].split("|") if "=" in part]
    return " | ".join(p.strip() for p in cpu)


def _system_info(lib: Path) -> str:
    res = subprocess.run([sys.executable, "-c", _SYSTEM_INFO, str(lib)], capture_output=True, text=True, check=True)
    return _features(res.stdout)


def wheel_features() -> str:
    """The CPU features the installed wheel's llama.cpp runs with on this machine."""
    import llama_cpp

    return _system_info(Path(llama_cpp.__file__).parent / "lib" / "libllama.so")


def compare_features(bin_dir: Path) -> dict[str, str]:
    """The CPU features of the installed wheel's llama.cpp and of the built one, each read in its own process."""
    import llama_cpp

    wheel_lib = Path(llama_cpp.__file__).parent / "lib" / "libllama.so"
    out = {}
    for key, lib in (("wheel", wheel_lib), ("built", bin_dir / "libllama.so")):
        res = subprocess.run([sys.executable, "-c", _SYSTEM_INFO, str(lib)], capture_output=True, text=True, check=True)
        out[key] = _features(res.stdout)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefillbench.backends.server.build", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", "-j", type=int, default=2, help="parallel compile jobs (default: 2)")
    parser.add_argument("--sdist", type=Path, default=None, help="use this llama_cpp_python-<version>.tar.gz instead of downloading it")
    parser.add_argument("--force", action="store_true", help="configure and build again from scratch")
    parser.add_argument("--check", action="store_true", help="after building, run each tool's --help")
    args = parser.parse_args(argv)
    stamp = build(args.jobs, sdist=args.sdist, force=args.force)
    print(f"llama.cpp tools from {PACKAGE} {stamp['version']} (built {stamp['built_at']}: configure "
          f"{stamp['configure_s']} s, build {stamp['build_s']} s with {stamp['jobs']} job(s))")
    print(f"CPU features (same as the installed wheel's): {stamp['cpu_features']}")
    for name, path in stamp["tools"].items():
        print(f"{name}: {path}")
        if args.check:
            res = subprocess.run([path, "--help"], capture_output=True, text=True)
            first = (res.stdout or res.stderr).strip().splitlines()
            print(f"  {name} --help: exit {res.returncode}, {len(first)} lines"
                  + (f" ({first[0][:80]!r})" if first else ""))
            if res.returncode != 0:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
