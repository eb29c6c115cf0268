"""How a server backend's client sends a run: in how many worker processes (`--client-workers N|auto`), on Ray
(`--client-ray`), which shard of the schedule this command sends (`--shard I/N`), and where latencies start
(`--latency-from scheduled|sent`). One validated value, parsed from the flags once."""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

from prefillbench.backends.server.client_workers import LOCAL_CORES, Slice, auto_workers, slices
from prefillbench.errors import BackendError
from prefillbench.sequence import Request

LATENCY_ORIGINS = ("scheduled", "sent")
#: What --client-ray without Ray says, in one line.
NO_RAY = "--client-ray runs the client's workers as Ray actors and needs Ray: pip install 'prefillbench[ray]'"


@dataclass(frozen=True)
class ClientSettings:
    workers: int | None = 1  # None: auto
    ray: bool = False
    shard: tuple[int, int] | None = None  # (I, N): this command sends slice I of N
    latency_from: str = "scheduled"

    @classmethod
    def parse(cls, workers: str | int | None = None, ray: bool = False, shard: str | None = None,
              latency_from: str | None = None) -> "ClientSettings":
        """The flags' text, checked; a bad value is one line (BackendError)."""
        count: int | None = 1
        if workers is not None and str(workers) != "auto":
            try:
                count = int(workers)
            except ValueError:
                raise BackendError(f"--client-workers {workers}: a number of processes, or auto") from None
            if count < 1:
                raise BackendError(f"--client-workers {workers}: at least 1")
        elif workers is not None:
            count = None
        parsed = None
        if shard is not None:
            match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", shard)
            if not match or not 0 <= int(match[1]) < int(match[2]):
                raise BackendError(f"--shard {shard}: I/N with 0 <= I < N (a Kubernetes Indexed Job's "
                                   "$JOB_COMPLETION_INDEX/N)")
            parsed = (int(match[1]), int(match[2]))
        if ray and importlib.util.find_spec("ray") is None:
            raise BackendError(NO_RAY)
        origin = latency_from or "scheduled"
        if origin not in LATENCY_ORIGINS:
            raise BackendError(f"--latency-from {origin}: choose from {', '.join(LATENCY_ORIGINS)}")
        return cls(count, ray, parsed, origin)

    def shard_of(self, requests: list[Request], concurrency: int) -> tuple[list[Request], int]:
        """This command's slice of the run's requests and concurrency (all of them without --shard)."""
        if self.shard is None:
            return requests, concurrency
        i, n = self.shard
        mine = [s for s in slices(requests, concurrency, n) if s.index == i and s.of == n]
        if not mine:
            raise BackendError(f"--shard {i}/{n}: the run has no slice {i} of {n} (fewer requests, or places in "
                               f"flight (-c {concurrency}), than shards)")
        return mine[0].requests, mine[0].concurrency

    def worker_slices(self, requests: list[Request], concurrency: int) -> list[Slice]:
        """The slices the workers send: as many as asked, or auto's choice (no core cap on Ray's cluster)."""
        n = self.workers if self.workers is not None else auto_workers(requests, concurrency,
                                                                       None if self.ray else LOCAL_CORES)
        return slices(requests, concurrency, n)

    @property
    def in_workers(self) -> bool:
        """Whether the run is sent from worker processes (or actors) rather than this process."""
        return self.ray or self.workers != 1

    def metadata(self) -> dict[str, object]:
        meta: dict[str, object] = {"client_workers": "auto" if self.workers is None else self.workers,
                                   "client_latency_from": self.latency_from}
        if self.ray:
            meta["client_placement"] = "ray"
        if self.shard is not None:
            meta["client_shard"] = f"{self.shard[0]}/{self.shard[1]}"
        return meta
