"""The tuner's final keep-or-drop decision: paired interleaved timings ``(tuned_s, default_s)`` -> ``Decision``.

The search's best is kept only when it beat the defaults, side by side, in significantly more
rounds than chance allows (a one-sided sign test) and by more than a small margin (the median of
the per-round ratios); otherwise the defaults stay.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ALPHA = 0.05  # the chance of keeping options that are not faster, over all looks together
MARGIN = 0.02  # the median round must be at least this much faster than the defaults
LOOKS = (20, 40, 60)  # rounds after which the decision is taken; later looks only while undecided

Pair = tuple[float, float]  # one round: (tuned seconds, default seconds), inf where a timing failed


@dataclass(frozen=True)
class Decision:
    """Whether to keep the tuned options, and the numbers it rests on."""

    keep: bool
    speedup: float  # median over the rounds of default / tuned seconds (nan without rounds)
    p_value: float  # one-sided sign test: P(at least ``wins`` wins | no difference)
    wins: int  # rounds the tuned options were faster in
    losses: int  # rounds the defaults were faster in (ties count for neither)
    alpha: float  # the significance level this decision was taken at
    margin: float
    pairs: tuple[Pair, ...]
    why: str

    @property
    def rounds(self) -> int:
        return len(self.pairs)


def sign_test_p(wins: int, trials: int) -> float:
    """P(X >= wins) for X ~ Binomial(trials, 1/2): how often a coin does at least this well."""
    if trials <= 0:
        return 1.0
    return sum(math.comb(trials, k) for k in range(max(wins, 0), trials + 1)) / 2.0**trials


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of what ``values`` sample (independent draws,
    such as the ratios of interleaved rounds): the j-th smallest and the j-th largest value, j the
    largest for which P(Binomial(n, 1/2) < j) <= (1 - ``level``) / 2, so that the interval holds the
    median with probability at least ``level``. None where too few values allow it (fewer than 6
    at 0.95)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    j = 0
    while j < (n + 1) // 2 and 2 * sign_test_p(n - j, n) <= 1.0 - level:  # P(X <= j) = P(X >= n - j)
        j += 1
    return (xs[j - 1], xs[n - j]) if j else None


def decide(pairs: Sequence[Pair], alpha: float = ALPHA, margin: float = MARGIN) -> Decision:
    """Keep the tuned options when they won significantly more rounds than the defaults (sign test
    p < ``alpha``; it assumes nothing about the noise but independent rounds, so a few slow outliers
    count as one lost round each) and their median round was more than ``margin`` faster. A round
    in which the tuned options failed drops them; one in which the defaults failed counts as won."""
    pairs = tuple((float(t), float(d)) for t, d in pairs)
    ratios = [d / t if math.isfinite(d) else math.inf for t, d in pairs if math.isfinite(t) and t > 0]
    wins, losses = sum(r > 1.0 for r in ratios), sum(r < 1.0 for r in ratios)
    p = sign_test_p(wins, wins + losses)
    speedup = statistics.median(ratios) if ratios else math.nan
    failed = len(ratios) < len(pairs)
    keep = not failed and p < alpha and speedup >= 1.0 + margin
    if not pairs:
        why = "no rounds could be timed"
    elif failed:
        why = "the tuned options failed in a round"
    else:
        verdict = "kept" if keep else "not kept"
        why = (f"{verdict}: won {wins} of {len(pairs)} rounds (sign test p = {p:.2g}, needs < {alpha:.3g}), "
               f"median round {speedup:.3f}x (needs >= {1.0 + margin:.3g}x)")
    return Decision(keep, speedup, p, wins, losses, alpha, margin, pairs, why)


def sequential(measure: Callable[[int], Pair | None], looks: Sequence[int] = LOOKS, alpha: float = ALPHA,
               margin: float = MARGIN) -> Decision:
    """Time rounds (``measure(r)`` -> round ``r``, or None when no more can be timed) up to each
    look in turn and decide there at ``alpha / len(looks)`` (so the chance of a false keep over all
    looks stays under ``alpha``). Going on to the next look only while the tuned options lead
    without significance; what was timed when ``measure`` gives up is decided at the same level."""
    level = alpha / max(1, len(looks))
    pairs: list[Pair] = []
    decision = decide(pairs, level, margin)
    for look in looks:
        while len(pairs) < look:
            pair = measure(len(pairs))
            if pair is None:
                return decide(pairs, level, margin)
            pairs.append(pair)
            if not math.isfinite(pair[0]):  # a candidate that fails once is not kept
                return decide(pairs, level, margin)
        decision = decide(pairs, level, margin)
        if decision.keep or not decision.speedup > 1.0:
            return decision
    return decision
