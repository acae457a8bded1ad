"""Bounded metric series: a run of any length keeps at most `capacity` points per series.

When a series fills up, neighbouring points are merged pairwise (x and y averaged, so the curve's shape and level
survive) and every later point is first averaged over a bucket twice as wide as before. Memory stays bounded and
a 100,000-step run still draws in a few milliseconds.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

DEFAULT_CAPACITY = 1024


class DownsampledSeries:
    """(x, y) points in increasing x, at most `capacity` of them (plus one partial bucket)."""

    __slots__ = ("capacity", "xs", "ys", "bucket", "_pending_x", "_pending_y", "_pending_n", "last", "count",
                 "version")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 4 or capacity % 2:
            raise ValueError("capacity must be an even number >= 4")
        self.capacity = capacity
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.bucket = 1  # raw points per stored point
        self._pending_x = 0.0
        self._pending_y = 0.0
        self._pending_n = 0
        self.last: tuple[float, float] | None = None  # the latest raw point
        self.count = 0  # raw points seen
        self.version = 0  # bumped on every change (charts redraw only when it moved)

    def append(self, x: float, y: float) -> None:
        self.extend((x,), (y,))

    def extend(self, xs: Sequence[float], ys: Sequence[float]) -> None:
        """Append points in increasing x (a chunk of a replayed log: without a call per point)."""
        if not math.isfinite(sum(ys)):  # (the sum is finite when every value is, or overflowed: filter then too)
            kept = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]  # nan/inf: not drawable
            xs, ys = [x for x, _ in kept], [y for _, y in kept]
        n = len(xs)
        if not n:
            return
        self.last = (xs[-1], ys[-1])
        self.count += n
        self.version += 1
        i = 0
        while i < n:
            room = self.capacity - len(self.xs)
            bucket = self.bucket
            if bucket == 1:  # a stored point per raw point (none pending): copy as many as fit
                take = min(n - i, room)
                self.xs += xs[i:i + take]
                self.ys += ys[i:i + take]
            elif self._pending_n:  # finish the pending bucket, stored when full
                take = min(n - i, bucket - self._pending_n)
                self._pending_x += sum(xs[i:i + take])
                self._pending_y += sum(ys[i:i + take])
                self._pending_n += take
                if self._pending_n == bucket:
                    self.xs.append(self._pending_x / bucket)
                    self.ys.append(self._pending_y / bucket)
                    self._pending_x = self._pending_y = 0.0
                    self._pending_n = 0
            elif n - i >= bucket:  # whole buckets at once, as many as fit: each the mean of its raw points
                take = min((n - i) // bucket, room) * bucket
                self.xs += bucket_means(xs[i:i + take], bucket)
                self.ys += bucket_means(ys[i:i + take], bucket)
            else:  # the rest starts the pending bucket
                take = n - i
                self._pending_x = sum(xs[i:n])
                self._pending_y = sum(ys[i:n])
                self._pending_n = take
            i += take
            if len(self.xs) >= self.capacity:
                self._halve()

    def rewind(self, x: float) -> None:
        """Drop the points after `x`: a run restarted from the checkpoint of step `x` logs those steps again. A
        merged point (a long run's bucket) stays or goes whole, by its mean x."""
        keep = bisect_right(self.xs, x)
        dropped = (len(self.xs) - keep) * self.bucket
        if self._pending_n and self._pending_x / self._pending_n > x:
            dropped += self._pending_n
            self._pending_x = self._pending_y = 0.0
            self._pending_n = 0
        if not dropped:
            return
        del self.xs[keep:], self.ys[keep:]
        self.count = max(0, self.count - dropped)
        self.last = (self.xs[-1], self.ys[-1]) if self.xs else None
        self.version += 1

    def _halve(self) -> None:
        self.xs = bucket_means(self.xs, 2)
        self.ys = bucket_means(self.ys, 2)
        self.bucket *= 2

    def points(self) -> tuple[list[float], list[float]]:
        """The stored points, with the partial bucket's mean as the newest one."""
        if self._pending_n:
            return (self.xs + [self._pending_x / self._pending_n], self.ys + [self._pending_y / self._pending_n])
        return list(self.xs), list(self.ys)

    def __len__(self) -> int:
        return len(self.xs) + (1 if self._pending_n else 0)


def bucket_means(values: Sequence[float], size: int) -> list[float]:
    """The mean of each run of `size` consecutive values (a last, shorter run left out), summed in C: `sum` of each
    run, as adding them one by one into 0.0 gives."""
    return [total / size for total in map(sum, zip(*[iter(values)] * size, strict=False))]


def ema(values: Sequence[float], alpha: float) -> list[float]:
    """Exponential moving average with weight `alpha` on the past (0 = no smoothing), debiased like W&B's."""
    if alpha <= 0 or not values:
        return list(values)
    out: list[float] = []
    smoothed = 0.0
    weight = 0.0
    for value in values:
        smoothed = alpha * smoothed + (1 - alpha) * value
        weight = alpha * weight + (1 - alpha)
        out.append(smoothed / weight)
    return out
