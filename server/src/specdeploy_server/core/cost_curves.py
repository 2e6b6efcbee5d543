"""Measured call costs for ``draftLen: auto`` (:mod:`specdeploy_server.core.adaptive`): seconds of a call as a
function of its size (:class:`CostCurve`), and of a draft call as a function of its passes too
(:class:`DraftCost`)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

#: a bucket of the cost curves spans a factor of sqrt(2) in size
BUCKETS_PER_DOUBLING = 2
#: a draft call's cost is fitted as fixed + per pass once this many pass counts are trusted at a size
FIT_AFTER = 3


def bucket_key(size: float) -> int:
    """The size bucket of a (positive) size."""
    return round(math.log2(size) * BUCKETS_PER_DOUBLING)


@dataclass
class _Bucket:
    """One size bucket's measurements: the latest ``window`` (size, seconds), their count, and the figure
    the curve uses (kept current on each measurement, so a search reads it without sorting)."""

    recent: deque[tuple[float, float]]
    count: int = 0
    size: float = 0.0
    seconds: float = 0.0
    last: int = 0  # the curve's clock at its latest measurement


@dataclass
class CostCurve:
    """Measured seconds of a call as a function of its size, per size bucket: the **typical** time of the
    bucket's latest ``window`` measurements (their median), because what a choice of draft length pays over
    many steps is what its calls usually take: on a contended CPU a large call can usually take 3 times its
    fastest time, and a cost that grows with something the size leaves out (the context length) must not be
    remembered at its cheapest. The median leaves out rare outliers (a late wake-up, a step that also
    prefilled a new prompt) as long as they are fewer than half of the window. A bucket is trusted from its
    ``trusted_after``-th measurement on; until then it keeps the least of its measurements (an outlier among
    the first, a warm-up call, is gone at the next one) and, where trusted buckets lie on both sides of it, is
    left out (its size estimated optimistically from them, and tried again: one unlucky measurement cannot
    rule such a size out). Outside the trusted sizes an untrusted bucket is used: a measurement says more
    about a size beyond them than extrapolating would (flat above one point: a batch of 128 drafting 10
    tokens each would look as cheap as drafting none), except just above them (:meth:`points`), where the
    trusted slope caps it until it is trusted itself.

    **Stale** figures are not trusted: a bucket not measured in the latest ``stale_after`` measurements of
    its curve (``clock``: shared by the curves of one :class:`DraftCost`) counts as untrusted again, and its
    next measurement starts it afresh. On a shared machine a call's time drifts with other people's load: a
    size measured while the machine was busy would otherwise look dear for good (a draft length not chosen
    is never measured again), while the sizes in use follow the machine; so each size the search could
    choose is measured again now and then, under the same conditions as the others.

    ``flat_below``: below the smallest measured size, the time of that size (a draft-model pass on a GPU
    costs one memory-bound forward however few sequences it carries) instead of a proportional share."""

    window: int = 9
    trusted_after: int = 3
    confirmed_after: int = 2
    flat_below: bool = False
    #: untrusted buckets up to this many above the largest trusted one are capped by the trusted slope
    near_above: int = BUCKETS_PER_DOUBLING
    stale_after: int = 100
    #: measurements so far (of this curve, or of every curve sharing the list)
    clock: list[int] = field(default_factory=lambda: [0])
    _buckets: dict[int, _Bucket] = field(default_factory=dict)

    def _trusted(self, bucket: _Bucket) -> bool:
        return bucket.count >= self.trusted_after and self.clock[0] - bucket.last <= self.stale_after

    def observe(self, size: float, seconds: float) -> bool:
        """Add a measurement; True while its bucket is not yet trusted (worth a new search)."""
        if size <= 0:
            return False
        key = bucket_key(size)
        bucket = self._buckets.get(key)
        self.clock[0] += 1
        if bucket is None or self.clock[0] - bucket.last > self.stale_after + 1:  # new, or stale: afresh
            bucket = self._buckets[key] = _Bucket(deque(maxlen=self.window))
        bucket.last = self.clock[0]
        bucket.recent.append((size, seconds))
        bucket.count += 1
        if bucket.count < self.trusted_after:
            # not yet trusted: the least of its measurements
            bucket.size, bucket.seconds = min(bucket.recent, key=lambda m: m[1])
        else:
            ordered = sorted(bucket.recent, key=lambda m: m[1])
            bucket.size, bucket.seconds = ordered[len(ordered) // 2]
        return bucket.count <= self.trusted_after

    @property
    def known(self) -> bool:
        return bool(self._buckets)

    @property
    def confirmed(self) -> bool:
        """Some size is measured at least twice."""
        return any(b.count >= self.confirmed_after for b in self._buckets.values())

    def trusted_keys(self) -> tuple[int, int] | None:
        """The least and greatest :func:`bucket_key` of the trusted buckets (None: none is trusted). A size
        whose key lies between them (or below them, for ``flat_below``) is estimated from trusted buckets
        only."""
        keys = [key for key, b in self._buckets.items() if self._trusted(b)]
        return (min(keys), max(keys)) if keys else None

    def points(self) -> list[tuple[float, float]]:
        """(size, seconds), sorted: the trusted buckets and the untrusted ones outside the trusted sizes (all
        while none is trusted). An untrusted bucket just above the trusted sizes (within ``near_above``
        buckets, a factor of 2) counts at no more than the trusted sizes' last slope makes it: a first
        measurement there may have been unlucky, and so close to what is known the slope says as much, so
        the size is tried again until it is trusted. Further above, the measurement is used as it is."""
        trusted = sorted((b.size, b.seconds) for b in self._buckets.values() if self._trusted(b))
        low, high = (trusted[0][0], trusted[-1][0]) if trusted else (math.inf, -math.inf)
        slope, near = None, 0
        if len(trusted) >= 2:
            (s0, t0), (s1, t1) = trusted[-2], trusted[-1]
            slope = max((t1 - t0) / (s1 - s0), 0.0)
            near = bucket_key(high) + self.near_above
        points = []
        for key, b in self._buckets.items():
            if self._trusted(b):
                points.append((b.size, b.seconds))
            elif not low < b.size < high:
                seconds = b.seconds
                if slope is not None and b.size > high and key <= near:
                    seconds = min(seconds, trusted[-1][1] + slope * (b.size - high))
                points.append((b.size, seconds))
        points.sort()
        # time does not fall as the size grows: a size measured slower than a larger one was interfered with
        for i in range(len(points) - 2, -1, -1):
            if points[i][1] > points[i + 1][1]:
                points[i] = (points[i][0], points[i + 1][1])
        return points

    def estimate(
        self, size: float, points: list[tuple[float, float]] | None = None, sizes: list[float] | None = None
    ) -> float:
        """Estimated seconds: the least consistent with the measured points (see the module docstring).
        ``points`` (and their ``sizes``), as :meth:`points` returns them, save recomputing them per call."""
        pts = self.points() if points is None else points
        if size <= 0 or not pts:
            return 0.0
        if sizes is None:
            sizes = [p[0] for p in pts]
        i = bisect.bisect_left(sizes, size)
        if i == 0:
            return pts[0][1] if self.flat_below else pts[0][1] * size / pts[0][0]
        if i == len(pts):
            if len(pts) == 1:
                return pts[-1][1]
            (s0, t0), (s1, t1) = pts[-2], pts[-1]
            slope = max((t1 - t0) / (s1 - s0), 0.0)
            return t1 + slope * (size - s1)
        # Between two measured sizes: the least time consistent with what a step costs on a GPU (time does
        # not fall as the size grows, time per token does not rise), exact for a roofline whose knee lies
        # between them; a size in between is then tried, not ruled out by a straight line across the knee.
        (s0, t0), (s1, t1) = pts[i - 1], pts[i]
        return max(t0, t1 * size / s1)


@dataclass
class DraftCost:
    """Measured seconds of a draft call as a function of its passes (k sequential draft-model forwards, pass j
    over the sequences proposing at least j tokens) and of its sequences per pass: one :class:`CostCurve`
    (seconds of the whole call by mean sequences per pass) per number of passes. A call's fixed cost (the
    drafter's host work, a launch) is in every pass count's figures as measured, not spread over passes as if
    a pass cost the call's time / k. A pass count not measured yet is estimated from the measured ones at the
    same size: between two, linearly in the passes; above the largest, along the per-pass slope of the last
    two (with one, in proportion); below the smallest, in proportion (optimistic: it is tried, then known).
    A pass count measured fewer times than its curve trusts (at that size) counts at the least of its own
    figure and that estimate from the trusted pass counts: one unlucky first call (a shape run for the first
    time, a late wake-up) cannot rule a draft length out for good, because the length is tried again until
    its typical time is known. Once ``FIT_AFTER`` pass counts are trusted at a size, the call is fitted as a
    fixed cost plus a cost per pass over them (Theil-Sen), which is what a draft call is (k forwards of the
    draft model after one call's overhead): one pass count's noisy median then moves the others by little.
    Fewer sequences per pass than measured cost what the smallest measured did (``flat_below``): a pass is a
    forward of the draft model, so leaving a few sequences out of it saves nothing on a GPU."""

    by_passes: dict[int, CostCurve] = field(default_factory=dict)
    #: the clock the pass counts' curves share: a pass count goes stale while the others are measured
    clock: list[int] = field(default_factory=lambda: [0])

    def observe(self, passes: int, sequences_per_pass: float, seconds: float) -> bool:
        """Add a call's measurement; True while its bucket is not yet trusted (worth a new search)."""
        if passes <= 0:
            return False
        curve = self.by_passes.setdefault(passes, CostCurve(flat_below=True, clock=self.clock))
        return curve.observe(sequences_per_pass, seconds)

    @property
    def known(self) -> bool:
        return bool(self.by_passes)

    def estimator(self) -> DraftEstimate:
        """The estimate under the current measurements (their points read once, for a whole search)."""
        curves = [(passes, curve, curve.points()) for passes, curve in self.by_passes.items()]
        return DraftEstimate(sorted((c for c in curves if c[2]), key=lambda c: c[0]))


class DraftEstimate:
    """Seconds of a draft call of ``passes`` passes over ``size`` sequences per pass (:class:`DraftCost`)."""

    def __bool__(self) -> bool:
        return bool(self._passes)

    def __init__(self, curves: list[tuple[int, CostCurve, list[tuple[float, float]]]]) -> None:
        self._passes = [p for p, _, _ in curves]
        self._curves = [(curve, points, [pt[0] for pt in points]) for _, curve, points in curves]
        self._trusted = [curve.trusted_keys() for _, curve, _ in curves]
        self._lines: dict[float, tuple[float, float]] = {}  # size -> (fixed seconds, seconds per pass)

    def _own(self, i: int, size: float) -> float:
        curve, points, sizes = self._curves[i]
        return curve.estimate(size, points, sizes)

    def _trusted_at(self, i: int, key: int) -> bool:
        keys = self._trusted[i]
        return keys is not None and key <= keys[1] and (self._curves[i][0].flat_below or keys[0] <= key)

    def __call__(self, passes: int, size: float) -> float:
        if passes <= 0 or size <= 0 or not self._passes:
            return 0.0
        key = bucket_key(size)
        trusted = [i for i in range(len(self._passes)) if self._trusted_at(i, key)]
        if len(trusted) >= FIT_AFTER:
            return self._fit(trusted, passes, size)
        every = list(range(len(self._passes)))
        estimate = self._interpolate(every, passes, size)
        if trusted and len(trusted) < len(every):
            estimate = min(estimate, self._interpolate(trusted, passes, size))
        return estimate

    def _fit(self, among: list[int], passes: int, size: float) -> float:
        """A call's fixed cost plus a cost per pass, fitted robustly to the pass counts ``among`` (Theil-Sen:
        the median of the slopes between every two of them, and the median of what each leaves as the fixed
        cost), so one pass count's noisy figure moves the estimate of the others by little."""
        line = self._lines.get(size)
        if line is None:  # one fit per size, for a whole search
            points = [(self._passes[i], self._own(i, size)) for i in among]
            slopes = sorted((t1 - t0) / (p1 - p0) for (p0, t0), (p1, t1) in itertools.combinations(points, 2))
            slope = max(slopes[len(slopes) // 2], 0.0)
            line = self._lines[size] = (sorted(t - slope * p for p, t in points)[len(points) // 2], slope)
        fixed, slope = line
        return max(fixed + slope * passes, 0.0)

    def _interpolate(self, among: list[int], passes: int, size: float) -> float:
        """The estimate from the pass counts ``among`` (indices into the measured ones, ascending)."""

        def at(n: int) -> float:
            # pass count among[n]'s own estimate, at most any larger pass count's (more passes cannot
            # take less time: a pass count measured slower than a larger one was interfered with, and is
            # tried again)
            return min(self._own(j, size) for j in among[n:])

        known = [self._passes[i] for i in among]
        n = bisect.bisect_left(known, passes)
        if n < len(known) and known[n] == passes:
            return at(n)
        if n == 0:
            return at(0) * passes / known[0]
        if n == len(known):
            last = at(n - 1)
            if n == 1:
                return last * passes / known[0]
            slope = max((last - at(n - 2)) / (known[n - 1] - known[n - 2]), 0.0)
            return last + slope * (passes - known[n - 1])
        low, high = at(n - 1), at(n)
        return low + (high - low) * (passes - known[n - 1]) / (known[n] - known[n - 1])
