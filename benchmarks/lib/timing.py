"""Timing steps on a busy machine or a GPU: contenders alternated rep by rep, so drift hits them alike."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


class Clock:
    """Seconds one call takes; on CUDA the device is synchronized before and after, so the work is counted, not its launch."""

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

    def paired_differences(self, other: "Timing") -> list[float]:
        """This time minus `other`'s, rep by rep (the two ran back to back in each rep)."""
        return [a - b for a, b in zip(self.seconds, other.seconds)]


def _alternate(contenders: dict[object, Callable[[], object]], reps: int, clock: Clock) -> dict[object, Timing]:
    out = {name: Timing([]) for name in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            out[name].seconds.append(clock(fn))
    return out


def time_interleaved(contenders: dict[object, Callable[[], object]], reps: int, clock: Clock) -> dict[object, Timing]:
    for fn in contenders.values():
        clock(fn)  # warm-up: allocations, kernel choices, graph captures
    return _alternate(contenders, reps, clock)


def time_within(contenders: dict[object, Callable[[], object]], seconds: float, clock: Clock,
                max_reps: int, min_reps: int = 3) -> dict[object, Timing]:
    """time_interleaved with as many reps as fit in `seconds` (judged by the warm-up round), between min_reps and max_reps."""
    t0 = time.perf_counter()
    for fn in contenders.values():
        clock(fn)
    # The warm-up round pays for allocations and first calls: a rep costs at most as much.
    per_rep = max(time.perf_counter() - t0, 1e-6)
    reps = max(min_reps, min(max_reps, int(seconds / per_rep)))
    return _alternate(contenders, reps, clock)


def time_both_ways(run: Callable[[object, bool], object], cases: dict, reps: int, clock: Clock) -> dict[object, tuple[Timing, Timing]]:
    """Each case run with a switch on and off (`run(case, on)`), all alternated rep by rep: {name: (on, off)}."""
    contenders = {(name, on): (lambda case=case, on=on: run(case, on)) for name, case in cases.items() for on in (True, False)}
    times = time_interleaved(contenders, reps, clock)
    return {name: (times[(name, True)], times[(name, False)]) for name in cases}


def piggyback(chunk: Timing, mixed: Timing, alone: Timing) -> tuple[float, float]:
    """(what k decodes add to a chunk's step, in units of the k decodes' own step, from medians; the same from the
    median of the paired differences): ((chunk + k decodes) - chunk) / (k decodes alone)."""
    paired = statistics.median(mixed.paired_differences(chunk))
    return (mixed.median - chunk.median) / alone.median, paired / alone.median
