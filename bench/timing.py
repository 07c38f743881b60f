"""Side-by-side timing: interleaved repeats, medians, ratios. No absolute CPU time is ever a result."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_values(runs: dict[str, Callable[[], float]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """What each run returns, measured in turns (a, b, c, a, b, c, ...) so drift hits all alike; the order
    rotates every round so none always goes first."""
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    values = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            values[name].append(runs[name]())
    return values


def interleaved(runs: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each run, measured as `interleaved_values` does."""

    def timed(run):
        def call() -> float:
            started = time.perf_counter()
            run()
            return time.perf_counter() - started

        return call

    return interleaved_values({name: timed(run) for name, run in runs.items()}, repeats, warmup)


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median of round-by-round ratios."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))
