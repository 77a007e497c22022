"""The lab: one fix measured on the running endpoint against the endpoint as written.

    lab = Lab(endpoint, body, timeout_s=30, budget_s=30)
    what_if = lab.compare(Fix("memoise-loaders", "loaders answered from memory", apply), concurrency=1)

Blocks of requests with the fix applied (B) alternate with blocks of the unchanged endpoint
(A), in the order A B B A A B ..., with the same body, so the machine's drift (a neighbour
starting, a CPU's clock) falls on both arms alike. Each pair of blocks gives one difference
of their medians; the saving is the median of those differences with its sign-test interval
(a block a neighbour slowed moves neither from 8 pairs, two on one side from 11).
The fix is applied only for its own blocks: between them, and after, the endpoint runs
exactly as written. A fix is abandoned, and reported as not tried with the reason, when a
request fails with it, when its answers differ from the unchanged endpoint's (beyond float
noise), or when it holds more memory than ``memory_bound_mb``.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from ...environment import CpuReading
from ..endpoints import untraced_load
from ..evidence import WhatIf
from .answers import Answers

__all__ = ["Abandon", "Fix", "Lab", "paired_saving", "settled"]

#: Pairs enough to stop early: from five, an interval covers at least 90% ...
SETTLED_PAIRS = 5
#: ... and once it is this tight (its half-width against the saving, or against the request's
#: own time when the saving is near zero), more pairs would not change what the finding says.
SETTLED_SHARE, SETTLED_OF_REQUEST = 0.1, 0.02
#: The least coverage of a saving's interval; the rules name a cause from a measured saving only
#: where its interval reached it, and they read the low end (a one-sided 95% bound at least)
INTERVAL_COVERAGE = 0.9
#: Pairs that give an interval at all: a fix stops at this many once past the doctor's time
MIN_INTERVAL_PAIRS = 2
#: At concurrency, the endpoint as written must serve at least this share of the throughput it
#: had in the concurrent phase without the probes: else its blocks did not run it as it runs,
#: and the difference is no saving (an `async def` forward's blocks served 59 req/s against 93
#: in that phase, beside the fix's blocks on 8 threads: the doctor said 6-20 ms to gain where
#: the fix cost 28 ms; on the endpoints where it measured true, 1.02-1.05)
UNCHANGED_RPS_SHARE = 0.8


def _sign_cdf(n: int) -> list[float]:
    """P(X <= k) for X ~ Binomial(n, 1/2), k = 0 .. n: how many of ``n`` pairs fall below their
    median, by chance."""
    return list(itertools.accumulate(math.comb(n, k) / 2**n for k in range(n + 1)))


def paired_saving(diffs: list[float]) -> tuple[float, float, float, float]:
    """(estimate, low, high, coverage) of the typical paired difference: the median of the
    pairs with its sign-test interval, the narrowest one between two of the pairs that covers
    at least ``INTERVAL_COVERAGE``. It assumes nothing of the pairs' spread: a block a
    neighbour slowed (a burst, a collection) does not move the estimate, nor the interval from
    8 pairs (from 11, two on one side), where the Wilcoxon interval's low end fell to the
    worst pair's level (one such pair in 11 took a 15-ms saving's low end to -15 ms). Too few
    pairs for that coverage give the widest interval, their smallest and largest, with the
    coverage it has (3 pairs: 75%)."""
    d, n = sorted(diffs), len(diffs)
    cdf = _sign_cdf(n)
    k = max((k for k in range(n // 2) if 1 - 2 * cdf[k] >= INTERVAL_COVERAGE), default=0)  # pairs cut from each end
    return statistics.median(d), d[k], d[n - 1 - k], 1 - 2 * cdf[k]


def settled(diffs: list[float], base_ms: float) -> bool:
    """Whether the pairs so far pin the saving down: at least ``SETTLED_PAIRS`` of them, and an
    interval within ``SETTLED_SHARE`` of the estimate, or within ``SETTLED_OF_REQUEST`` of the
    request's time (a saving of about nothing). A fix whose blocks agree pair after pair then
    costs the doctor no more of its time; a noisy one still gets every pair it can."""
    if len(diffs) < SETTLED_PAIRS:
        return False
    est, low, high, _ = paired_saving(diffs)
    return (high - low) / 2 <= max(SETTLED_SHARE * abs(est), SETTLED_OF_REQUEST * base_ms)


class Abandon(Exception):
    """The fix cannot be measured on this endpoint; the message says why."""


@dataclass
class Fix:
    """One fix the doctor can apply for a block of requests and undo after.

    ``apply()`` applies it and returns the undo; ``hits()`` says how often it took effect (a
    memoised call answered from memory), ``release()`` frees what it kept across its blocks.
    ``same_answers``: the fix must not change an answer (False for ``eval()``, whose point is
    to change answers that dropout randomises)."""

    name: str
    words: str
    apply: Callable[[], Callable[[], None]]
    same_answers: bool = True
    hits: Callable[[], int] | None = None
    release: Callable[[], None] | None = None
    no_effect: str = ""  # why it may never take effect (said only when it did not)
    #: at one client, ``release()`` after each of its blocks and one uncounted request before
    #: the next: the blocks as written then run without what the fix keeps (a 19-MB checkpoint
    #: kept alive by the fix made the loads as written cost about twice what they cost a process
    #: that loads on every request: docs/benchmarks.md, session 15)
    release_each_block: bool = False
    #: uncounted requests with the fix before its first block (one that learns from a request
    #: before it acts, and checks its first answer, does both outside the timed blocks)
    prime: int = 1
    #: true while a primed request's answer is altered on purpose (a test of the endpoint's own
    #: code, as the items' dependency test scales a model's answers): that answer is not compared
    altered: Callable[[], bool] | None = None
    #: at c > 1, each block's figure is the mean time a request spends, its callers over its
    #: throughput (Little's law), not its median: for a fix that changes how the queue is served
    #: (a loop that takes its waiting requests in no set order, against threads that share the
    #: cores), a short block's median as written runs below its steady state (measure "mean")
    by_throughput: bool = False


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _memory_mb() -> float | None:
    """The process's resident memory, and what torch holds on its GPU when CUDA is in use."""
    rss = _rss_mb()
    torch = sys.modules.get("torch")
    try:
        if rss is not None and torch is not None and torch.cuda.is_initialized():
            rss += torch.cuda.memory_allocated() / 2**20
    except Exception:  # a CUDA runtime that cannot say: the host's figure alone
        pass
    return rss


def _available_mb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Lab:
    """Runs fixes against the unchanged endpoint, each within ``per_fix_s`` and all within
    ``budget_s``. ``tick(phase)`` is called after every block (the parent hears progress)."""

    #: At most 12 pairs (a fast fix ends there in about 3 s; a slow one ends on its time, or
    #: once its pairs agree, ``settled``): with 8, two blocks a neighbour slowed in one run of
    #: three took a 3.8-ms saving's interval below zero (hf_classifier's fewer threads:
    #: -0.35 to 6.2 ms), where the two runs beside it measured 2.2-5.4 (docs/benchmarks.md,
    #: session 16). When to stop depends on the interval's width, never on its sign.
    MIN_PAIRS, MAX_PAIRS = 3, 12
    #: A block lasts about this long (several fast requests, or one slow one).
    BLOCK_S = 0.25
    MAX_BLOCK = 6

    def __init__(
        self,
        endpoint: Any,
        body: bytes,
        *,
        timeout_s: float,
        budget_s: float,
        per_fix_s: float = 8.0,
        memory_bound_mb: float | None = None,
        tick: Callable[[str], None] = lambda phase: None,
        clock: Callable[[], float] = time.perf_counter,
        base: tuple[Any, bool, float, bool | None] | None = None,
        concurrent_rps: float | None = None,
        short: str = "",
    ) -> None:
        self.endpoint, self.body, self.timeout_s = endpoint, body, timeout_s
        self.per_fix_s, self.tick, self.clock = per_fix_s, tick, clock
        self.deadline = clock() + budget_s
        self._streamed: bool | None = None
        #: the endpoint as written, from the first fix's first block (or an earlier lab's, on the
        #: same endpoint and body): (answer, varies, ms, streamed)
        self.base = base
        #: the unchanged endpoint's throughput at the concurrency the fixes run at (what a block
        #: there takes), where the doctor measured it
        self.concurrent_rps = concurrent_rps
        #: why the time is short, where the caller knows (said after "ran out" and "time left")
        self.short = short
        #: the medians of the unchanged endpoint's blocks, every fix's: how much it moves here
        self.unchanged: list[float] = []
        avail = _available_mb()
        self.memory_bound_mb = memory_bound_mb if memory_bound_mb is not None else min(2048.0, 0.5 * avail) if avail else 2048.0

    def left(self) -> float:
        return self.deadline - self.clock()

    def spread_ms(self) -> float | None:
        """How far the unchanged endpoint's blocks at one client moved so far (p90 - p50 of
        their medians, from 4 blocks), or None before."""
        if len(self.unchanged) < 4:
            return None
        cuts = statistics.quantiles(self.unchanged, n=10, method="inclusive")
        return cuts[8] - statistics.median(self.unchanged)

    def resolvable_ms(self, p50_ms: float, spread_ms: float) -> float:
        """About the smallest saving that pairs of blocks at one client could tell from none in
        the time a fix gets here, for requests of ``p50_ms`` whose time moves by ``spread_ms``
        (p50 to p90, request to request) and the blocks as written so far: a block's median
        moves by the larger of that spread over the root of its requests and the blocks' own
        spread; a pair's difference by about 1.4x that, and the interval's half-width by about
        twice that over the root of the pairs the time allows."""
        n = self._requests_per_block(p50_ms)
        noise = max(spread_ms / math.sqrt(n), self.spread_ms() or 0.0)
        fix_s = min(self.per_fix_s, max(self.left(), 0.0) / 3)
        pairs = min(self.MAX_PAIRS, max(self.MIN_PAIRS, fix_s * 1000 / (2 * n * max(p50_ms, 0.01))))
        return 2 * noise / math.sqrt(pairs)

    def _requests_per_block(self, seq_ms: float) -> int:
        return max(1, min(self.MAX_BLOCK, round(self.BLOCK_S * 1000 / seq_ms)))

    # -- one fix -----------------------------------------------------------------------------
    def compare(self, fix: Fix, *, concurrency: int = 1, requests: int | None = None) -> WhatIf:
        """Measure ``fix`` at ``concurrency`` callers (``requests`` per block when > 1)."""
        out = WhatIf(fix=fix.words, concurrency=concurrency)
        if self.left() < 1.0:
            out.why_not = "the doctor's time for experiments ran out before this one" + self.short
            return out
        cpu = CpuReading()
        self._streamed = None
        try:
            self._measure(fix, concurrency, requests, out)
        except Abandon as exc:
            out.tried, out.why_not = False, str(exc)
            out.saving_ms = out.low_ms = out.high_ms = None
        finally:
            if fix.release is not None:
                fix.release()
        out.cores_idle, out.others_cores, out.cpu_pressure = cpu.since()
        return out

    def _measure(self, fix: Fix, c: int, requests: int | None, out: WhatIf) -> None:
        answers = Answers(same=fix.same_answers)
        # the endpoint as written first: its time, and the answer to compare the fix's against;
        # a streamed answer is measured by its first chunk (what its reader waits for). Once
        # per lab: the fixes after the first compare with the same answer and time (every
        # block of theirs as written is checked against it again)
        if self.base is None:
            lat, _ = self._block(None, 2, answers)  # (two: does it answer the same each time?)
            self.base = (answers.reference, answers.base_varies, max(statistics.median(lat), 0.01), self._streamed)
        else:
            answers.reference, answers.base_varies, _, self._streamed = self.base
            answers.seen = True
        seq_ms = self.base[2]
        if self._streamed:
            out.measure = "first chunk"
        n = 1 if c > 1 else self._requests_per_block(seq_ms)
        per_block = requests or self._per_block(c, seq_ms)
        if c > 1 and self.concurrent_rps:
            need = 2 * MIN_INTERVAL_PAIRS * per_block / self.concurrent_rps
            if need > self.left():
                raise Abandon(
                    f"the doctor's time left for it ({max(self.left(), 0.0):.0f} s) is less than two pairs of its blocks take here "
                    f"(about {need:.0f} s: {per_block} requests a block at {self.concurrent_rps:g} req/s, the throughput measured at c={c})"
                    + self.short
                )
        base_mb = _memory_mb()  # what the fix keeps across its blocks shows in every block after
        for _ in range(fix.prime):  # primes the fix (fills its memos): not counted; one block each, as
            self._block(fix, 1, answers)  # a fix that learns from a request may act on the next
        primed = True
        # (a third of what is left at most: the fixes after this one get their pairs too)
        stop = self.clock() + min(self.per_fix_s, self.left() / 3)
        by_rate = c > 1 and fix.by_throughput and not self._streamed
        a_meds, b_meds, a_all, b_all, a_rps, b_rps = [], [], [], [], [], []
        pairs, pair_s = 0, 0.0
        while pairs < self.MAX_PAIRS and (pairs < self.MIN_PAIRS or self.clock() < stop or self._one_short(pairs, pair_s)):
            if pairs >= MIN_INTERVAL_PAIRS and self.clock() + pair_s > self.deadline:
                break  # another pair would end past the doctor's budget: stop with what was measured (2 pairs give an interval)
            if pairs >= SETTLED_PAIRS and settled([a - b for a, b in zip(a_meds, b_meds)], statistics.median(a_all)):
                break  # the pairs agree: more would not change the finding
            order, pair_t0 = ((None, fix) if pairs % 2 == 0 else (fix, None)), self.clock()
            for arm in order:
                if c > 1:
                    lat, rps = self._concurrent(arm, c, per_block)
                else:
                    if arm is not None and not primed:
                        self._block(arm, 1, answers)
                        primed = True
                    lat, rps = self._block(arm, n, answers)
                (b_meds if arm else a_meds).append(1000 * c / rps if by_rate and rps else statistics.median(lat))
                if arm is None and c == 1:
                    self.unchanged.append(a_meds[-1])
                (b_all if arm else a_all).extend(lat)
                if rps is not None:
                    (b_rps if arm else a_rps).append(rps)
                now = _memory_mb()
                if now is not None and base_mb is not None:
                    out.extra_mb = max(out.extra_mb or 0.0, round(now - base_mb, 1))
                    if now - base_mb > self.memory_bound_mb:
                        raise Abandon(
                            f"with the fix the process held {now - base_mb:.0f} MB more than before it, over the "
                            f"{self.memory_bound_mb:.0f} MB the doctor allows an experiment (a second copy of a large model)"
                        )
                if arm is not None and c == 1 and fix.release_each_block and fix.release is not None:
                    fix.release()  # (after the memory it kept was weighed above)
                    primed = False
                self.tick(f"trying a fix: {fix.words}")
            pairs, pair_s = pairs + 1, self.clock() - pair_t0
            if pairs == 1 and fix.hits is not None and fix.hits() == 0:
                # a whole block with the fix and it never acted (a `def` route's response that
                # the framework encodes on the loop): more pairs would time the endpoint twice
                # as written (a gallery run spent 30 s on three such pairs)
                raise Abandon("the fix never took effect: " + (fix.no_effect or "no call it changes was made"))
        base_rps = round(statistics.median(a_rps), 2) if a_rps else None
        if base_rps is not None and self.concurrent_rps and base_rps < UNCHANGED_RPS_SHARE * self.concurrent_rps:
            raise Abandon(
                f"the endpoint as written served {base_rps:g} req/s at c={c} between the fix's blocks, against "
                f"{self.concurrent_rps:g} in the concurrent phase: its blocks did not run it as it runs, so their "
                "difference is not a saving to bank"
            )
        diffs = [a - b for a, b in zip(a_meds, b_meds)]
        est, low, high, coverage = paired_saving(diffs)
        out.pair_diffs_ms = [round(d, 3) for d in diffs]
        out.tried = True
        out.pairs, out.requests = pairs, len(b_all)
        out.base_p50_ms, out.fixed_p50_ms = round(statistics.median(a_all), 3), round(statistics.median(b_all), 3)
        if by_rate and len(a_meds) == len(a_rps) and len(b_meds) == len(b_rps):  # (every block's figure from its throughput)
            out.measure = "mean"  # (base_p50_ms and fixed_p50_ms: the typical block's mean, as the pairs compare)
            out.base_p50_ms, out.fixed_p50_ms = round(statistics.median(a_meds), 3), round(statistics.median(b_meds), 3)
        out.saving_ms, out.low_ms, out.high_ms = round(est, 3), round(low, 3), round(high, 3)
        out.coverage = round(coverage, 3)
        if base_rps is not None and b_rps:
            out.base_rps, out.fixed_rps = base_rps, round(statistics.median(b_rps), 2)
        out.answers = answers.verdict()
        if fix.hits is not None:
            out.hits = fix.hits()
            if out.hits == 0:
                raise Abandon("the fix never took effect: " + (fix.no_effect or "no call it changes was made"))

    def _one_short(self, pairs: int, pair_s: float) -> bool:
        """A fix one pair short of ``SETTLED_PAIRS`` when its own time ran out gets that pair
        where the doctor's time has room for it: its interval then covers 94%, not 88% (the
        rules name a cause from a measured saving only at 90%)."""
        return pairs == SETTLED_PAIRS - 1 and self.clock() + pair_s < self.deadline

    def _per_block(self, c: int, seq_ms: float) -> int:
        """Requests in a block at ``c`` callers: four a caller, so the load settles within a
        block; down to one a caller where ``MIN_PAIRS`` pairs of such blocks would not end
        within the time left, judged by the unchanged endpoint's throughput at ``c`` where the
        doctor measured it, else by its sequential latency (its callers served one after
        another: what a block costs at most when they gain nothing from each other). A slow
        endpoint, or a busy machine, would otherwise spend minutes here (one of 1.4-s requests
        beside a neighbour: 19 s on two pairs of blocks of 16 at c=8)."""
        per_s = self.concurrent_rps or 1000 / seq_ms
        fits = self.left() / (2 * self.MIN_PAIRS + 1) * per_s
        return max(c, min(4 * c, int(fits)))

    def _block(self, fix: Fix | None, n: int, answers: Answers) -> tuple[list[float], None]:
        undo = fix.apply() if fix is not None else None
        try:
            lat = []
            got = self.endpoint.one_by_one(self.body, n, self.timeout_s, n * self.timeout_s)  # (from the helper where an app has one)
            altered = fix is not None and fix.altered is not None and fix.altered()  # (primed requests: blocks of one)
            for o in got:
                if o.error and altered:
                    raise Abandon(f"a request failed while the doctor altered the model's answers to test the endpoint's code ({o.error})"[:300])
                if o.error:
                    raise Abandon(
                        (f"a request failed with the fix applied ({o.error})" if fix else f"the unchanged endpoint failed during the experiment ({o.error})")[:300]
                    )
                if not altered:
                    answers.add(o.answer, fixed=fix is not None)
                o.answer = None
                lat.append(self._stat(o))
            return lat, None
        finally:
            if undo is not None:
                undo()

    def _concurrent(self, fix: Fix | None, c: int, n: int) -> tuple[list[float], float | None]:
        # an app's load comes from a helper process where it can (endpoints/outside.py): a load
        # generator in this process shares the GIL with the app, and costs the faster arm more
        undo = fix.apply() if fix is not None else None
        try:
            obs, elapsed = untraced_load(self.endpoint, self.body, c, n, self.timeout_s, max(self.per_fix_s, 1.0))
        finally:
            if undo is not None:
                undo()
        bad = [o.error for o in obs if o.error]
        if bad:
            who = "with the fix applied" if fix else "of the unchanged endpoint, during the experiment"
            raise Abandon(f"{len(bad)} of {len(obs)} concurrent requests {who} failed ({bad[0]})"[:300])
        if not obs:
            raise Abandon("no concurrent request finished within the experiment's time")
        return [self._stat(o) for o in obs], (len(obs) / elapsed if elapsed > 0 else None)

    def _stat(self, o: Any) -> float:
        """A request's figure: its latency, or for a streamed answer its first chunk's."""
        if self._streamed is None:
            self._streamed = o.first_chunk_ms is not None
        return o.first_chunk_ms if self._streamed and o.first_chunk_ms is not None else o.latency_ms
