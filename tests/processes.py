"""The processes this test session started that are still running (the CLI's children, the servers they launched),
found by the mark conftest puts in the environment every one of them inherits: a check that no server outlived
its command must not see another test session's servers on the same machine."""
from __future__ import annotations

import os
from collections.abc import Callable

MARK_VARIABLE = "PREFILLBENCH_TEST_SESSION"


def session_processes(match: Callable[[str], bool]) -> list[str]:
    """'pid command line' of each process of this session whose command line `match`es."""
    mark = f"{MARK_VARIABLE}={os.environ.get(MARK_VARIABLE, '')}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().rstrip(b"\0").split(b"\0")
            if not match(" ".join(a.decode(errors="replace") for a in args)):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(f"{pid} {' '.join(a.decode(errors='replace') for a in args)}")
    return found
