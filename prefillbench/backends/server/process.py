"""A serving engine's process, owned: started in its own process group on 127.0.0.1, its output in a log file,
ready when its health endpoint says so (the seconds from launch to ready kept), stopped (SIGTERM, then SIGKILL, of
the whole group and of every descendant that left it) however prefillbench ends, so that no server outlives the
command. vLLM is three processes (its API server, `VLLM::EngineCore`, `VLLM::Worker`), started by multiprocessing
in the API server's group; the descendants are found through /proc all the same, so that an engine whose children
call setsid is stopped whole too."""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from prefillbench.errors import BackendError

#: How long a server may take to load its model and answer its health check.
START_TIMEOUT_S = 300.0
#: How long a server has to exit after SIGTERM before its group is killed.
STOP_GRACE_S = 5.0
#: Lines of a server's log shown when it fails to start or dies.
LOG_TAIL_LINES = 12

_running: set["ServerProcess"] = set()


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: the kernel kills it if prefillbench dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG; elsewhere the atexit and signal handlers below are all there is)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _stop_all() -> None:
    for server in list(_running):
        server.stop()


def _on_signal(signum, frame) -> None:
    """SIGTERM (a CI timeout, `kill`) ends prefillbench as Ctrl-C does: the servers are stopped on the way out."""
    _stop_all()
    raise KeyboardInterrupt


def _forget_in_child() -> None:
    """In a forked child (tune's and the design search's workers): the servers and the SIGTERM handler belong to
    the parent. Inherited, the handler turned the pool's SIGTERM into a KeyboardInterrupt the worker survived, and a
    worker left alive hung the parent's exit (its pool's manager thread is joined then); the copy of `_running`
    would have let a child stop the parent's servers."""
    _running.clear()
    if signal.getsignal(signal.SIGTERM) is _on_signal:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


atexit.register(_stop_all)
os.register_at_fork(after_in_child=_forget_in_child)


class ServerProcess:
    """One launch of a server command (a list of arguments: never through a shell)."""

    def __init__(self, argv: list[str], health_url: str, log_dir: Path | None = None, env: dict[str, str] | None = None):
        self.argv, self.health_url = argv, health_url
        folder = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="prefillbench-server-"))
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / f"{Path(argv[0]).name}-{os.getpid()}-{int(time.time() * 1000)}.log"
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None  # seconds from launch to the first health 200

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Launch and wait until the health endpoint answers 200; BackendError with the log's last lines if the
        process exits first or the time runs out."""
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_signal)
        with self.log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, env=self.env, preexec_fn=_die_with_parent)
            except OSError as e:
                raise BackendError(f"cannot start {self.argv[0]}: {e.strerror or e}") from None
        _running.add(self)
        launched = time.monotonic()
        deadline = launched + timeout_s
        try:
            while True:
                if self.proc.poll() is not None:
                    raise BackendError(f"{Path(self.argv[0]).name} exited with status {self.proc.returncode} before it "
                                       f"was ready{self.log_tail()}")
                if self._healthy():
                    self.ready_s = time.monotonic() - launched
                    return
                if time.monotonic() > deadline:
                    raise BackendError(f"{Path(self.argv[0]).name} was not ready after {timeout_s:.0f} s{self.log_tail()}")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def settle(self, timeout_s: float = 1.0) -> None:
        """Wait up to `timeout_s` for the process to exit, where it is on its way out."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass

    def died(self) -> BackendError | None:
        """The error to end a run with, where the server has exited."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return BackendError(f"{Path(self.argv[0]).name} exited with status {self.proc.returncode} during the run"
                            f"{self.log_tail()}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return f"; its log ({self.log_path}) ends: " + " | ".join(line.strip() for line in text) if text else ""

    def stop(self) -> None:
        """SIGTERM to the process group and every descendant, SIGKILL after STOP_GRACE_S; idempotent."""
        _running.discard(self)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        tree = descendants(proc.pid)  # before the signal: once the parent is gone its children are reparented
        _signal(proc.pid, tree, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        tree |= descendants(proc.pid) if proc.poll() is None else set()
        # the group outlives its leader where the leader died first (a killed API server leaves its engine core)
        while (_group_alive(proc.pid) or any(_exists(p) for p in tree)) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal(proc.pid, tree, signal.SIGKILL)
        proc.wait()
        # what is no child of ours any more is reaped by init: wait until it is gone
        while (_group_alive(proc.pid) or any(_exists(p) for p in tree)) and time.monotonic() < deadline + STOP_GRACE_S:
            time.sleep(0.02)


def _signal(group: int, pids: set[int], signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _exists(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(root: int) -> set[int]:
    """Every process below `root` (children, theirs, ...), from /proc's parent links (empty where there is no /proc)."""
    parents: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return set()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
