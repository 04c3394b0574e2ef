"""Timing one candidate: warm-up, repeats, outliers dropped, the median.

On a shared machine single calls are disturbed by other work (on this project's 2-core machines a
preempted call reads 2-10x its time). The median of the calls that remain after dropping those
beyond 1.5 interquartile ranges of the quartiles is what the tuner compares; the relative spread
(IQR / median) goes into the cache and the report so that a decision between two candidates
closer than their spread can be called a tie.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .cache import Timing, TimingCache


def robust_timing(samples_s: list[float]) -> Timing:
    """The :class:`Timing` of raw call times: median after dropping outliers, and the spread."""
    if not samples_s:
        raise ValueError("no samples to summarise")
    arr = np.asarray(samples_s, dtype="float64")
    q1, q3 = np.percentile(arr, [25, 75])
    iqr = q3 - q1
    kept = arr[(arr >= q1 - 1.5 * iqr) & (arr <= q3 + 1.5 * iqr)]
    median = float(np.median(kept))
    spread = float(iqr / median) if median > 0 else 0.0
    return Timing(median_s=median, samples=int(kept.size), spread=spread)


def time_call(fn: Callable[[], object], warmup: int = 2, repeat: int = 15,
              min_total_s: float = 0.0, max_repeat: int = 1000) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then at least ``repeat`` timed ones (more, up to
    ``max_repeat``, until ``min_total_s`` has been spent), summarised by :func:`robust_timing`."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    spent = 0.0
    while len(samples) < repeat or (spent < min_total_s and len(samples) < max_repeat):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        samples.append(dt)
        spent += dt
    return robust_timing(samples)


def time_alternately(fns: Sequence[Callable[[], object]], rounds: int = 3, repeat: int = 15) -> list[Timing]:
    """Time several candidates side by side: ``rounds`` rounds of :func:`time_call` each, the order
    reversed every other round (so drift in the machine's load favours none), and per candidate
    the median of its round medians."""
    medians: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = list(range(len(fns)))
        for i in order if r % 2 == 0 else reversed(order):
            medians[i].append(time_call(fns[i], warmup=2, repeat=repeat).median_s)
    return [Timing(float(np.median(m)), rounds * repeat) for m in medians]


def time_cached(cache: TimingCache, key: str, make: Callable[[], Callable[[], object]], repeat: int = 15,
                min_total_s: float = 0.05) -> Timing:
    """The timing of ``key`` from ``cache``, else ``make()``'s callable timed (3 warm-up calls,
    :func:`time_call`) and stored: the candidate is created only on a miss."""
    timing = cache.get(key)
    if timing is None:
        timing = time_call(make(), warmup=3, repeat=repeat, min_total_s=min_total_s)
        cache.put(key, timing)
    return timing


def random_input(rng: np.random.Generator, shape: Sequence[int], dtype: str | np.dtype) -> np.ndarray:
    """A made-up input of ``shape`` and ``dtype`` to time or check with: standard normals, integers
    0 (valid indices: token ids through a checked take)."""
    dt = np.dtype(dtype)
    return np.zeros(shape, dt) if dt.kind in "iub" else rng.standard_normal(shape).astype(dt)
