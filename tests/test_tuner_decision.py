"""The tuner's final keep-or-drop decision against the defaults: the pure decision on synthetic
paired timings (kept only when faster with significance and by a margin; robust to outliers; a
false-keep rate under alpha on heavy-tailed noise), its sequential looks, and the tuner end to end
with runners that report chosen times."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import tcdsl as tc
from tcdsl.options import MappingOptions
from tcdsl.tuner import tune as T
from tcdsl.tuner.cache import TuningCache
from tcdsl.tuner.decide import ALPHA, LOOKS, MARGIN, Pair, decide, median_interval, sequential, sign_test_p

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def noisy_pairs(rng: np.random.Generator, n: int, speedup: float, base: float = 1e-3) -> list[Pair]:
    """``n`` rounds of (tuned, default) seconds on a loaded machine: a load level shared by the
    round, heavy-tailed (Student t, 2 degrees of freedom) noise of each call, and now and then a
    call slowed down several times (another process took the core)."""
    pairs = []
    for _ in range(n):
        load = math.exp(0.2 * rng.standard_normal())
        t, d = (base * load * math.exp(0.05 * rng.standard_t(2)) * (1 + 4 * rng.exponential() * (rng.random() < 0.1))
                for _ in range(2))
        pairs.append((t / speedup, d))
    return pairs


def test_clearly_faster_is_kept_equal_and_slower_are_dropped():
    rng = np.random.default_rng(1)
    faster = decide(noisy_pairs(rng, 20, 1.25))
    assert faster.keep and faster.p_value < ALPHA and faster.speedup > 1.1, faster.why
    assert faster.rounds == 20 and faster.wins + faster.losses == 20 and "kept: won" in faster.why
    equal = decide(noisy_pairs(rng, 20, 1.0))
    assert not equal.keep and 0.8 < equal.speedup < 1.25, equal.why
    slower = decide(noisy_pairs(rng, 20, 0.8))
    assert not slower.keep and slower.speedup < 1.0 and slower.p_value > 0.5, slower.why


def test_significant_but_below_the_margin_is_dropped():
    pairs = [(1.0, 1.0 + MARGIN / 2)] * 20  # faster in every round, by less than the margin
    d = decide(pairs)
    assert d.wins == 20 and d.p_value < 1e-5 and not d.keep
    assert d.speedup == pytest.approx(1 + MARGIN / 2)


def test_one_huge_outlier_does_not_flip_the_decision():
    rng = np.random.default_rng(2)
    faster = noisy_pairs(rng, 20, 1.3)
    faster[7] = (faster[7][0] * 100, faster[7][1])  # the tuned options' call stalled once
    d = decide(faster)
    assert d.keep and d.losses >= 1, d.why
    equal = [(1e-3 * (1 + 0.01 * ((i * 7) % 5 - 2)), 1e-3 * (1 + 0.01 * ((i * 3) % 5 - 2))) for i in range(20)]
    equal[3] = (equal[3][0], equal[3][1] * 100)  # the defaults' call stalled once
    d = decide(equal)
    assert not d.keep and d.p_value > 0.1, d.why


def test_a_round_the_tuned_options_fail_drops_them_and_one_the_defaults_fail_counts_as_won():
    pairs = [(0.5e-3, 1e-3)] * 19
    assert decide(pairs).keep
    d = decide([*pairs, (math.inf, 1e-3)])
    assert not d.keep and "failed" in d.why
    d = decide([*pairs, (0.5e-3, math.inf)])
    assert d.keep and d.wins == 20
    none = decide([])
    assert not none.keep and none.rounds == 0 and math.isnan(none.speedup) and none.p_value == 1.0


def test_the_sign_test_is_the_binomial_tail():
    stats = pytest.importorskip("scipy.stats")
    for n in (1, 5, 20, 40, 60):
        for wins in range(n + 1):
            want = stats.binomtest(wins, n, 0.5, alternative="greater").pvalue
            assert sign_test_p(wins, n) == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert sign_test_p(0, 0) == 1.0


def test_false_keeps_stay_under_alpha_on_heavy_tailed_noise():
    """Options no faster than the defaults, timed on a noisy machine: over many searches, the
    single test at 20 rounds and the sequential looks each keep them in under 5 % of cases; options
    20 % faster are kept nearly always."""
    rng = np.random.default_rng(3)
    trials = 1000
    single = sum(decide(noisy_pairs(rng, 20, 1.0)).keep for _ in range(trials))
    looked = 0
    for _ in range(trials):
        pairs = noisy_pairs(rng, max(LOOKS), 1.0)
        looked += sequential(lambda r, pairs=pairs: pairs[r]).keep
    assert single / trials < 0.05 and looked / trials < 0.05, (single, looked)
    kept = 0
    for _ in range(200):
        pairs = noisy_pairs(rng, max(LOOKS), 1.2)
        kept += sequential(lambda r, pairs=pairs: pairs[r]).keep
    assert kept / 200 > 0.95, kept


def test_sequential_looks_go_on_only_while_undecided_and_stop_when_timing_stops():
    asked: list[int] = []

    def rounds(pattern: list[bool]) -> Any:
        def measure(r: int) -> Pair:
            asked.append(r)
            return (0.9, 1.0) if pattern[r % len(pattern)] else (1.1, 1.0)
        return measure

    d = sequential(rounds([True]))  # faster in every round: decided at the first look
    assert d.keep and d.rounds == LOOKS[0] and d.alpha == pytest.approx(ALPHA / len(LOOKS))
    asked.clear()
    d = sequential(rounds([True, True, False]))  # ahead without significance at 20: the next looks
    assert d.rounds > LOOKS[0] and len(asked) == d.rounds
    d = sequential(rounds([False]))  # behind: no more rounds
    assert not d.keep and d.rounds == LOOKS[0]
    d = sequential(lambda r: (0.5, 1.0) if r < 7 else None)  # the budget ends after 7 rounds
    assert d.rounds == 7 and d.keep  # 7 of 7 won: p = 1/128 < 0.05 / 3
    d = sequential(lambda r: (0.5, 1.0) if r < 5 else None)
    assert d.rounds == 5 and not d.keep  # 5 of 5 won: p = 1/32, not enough at 0.05 / 3


def test_a_budget_holds_back_time_for_the_final_rounds():
    """The search ends early enough for the final rounds: the timer's setup, the defaults' and the
    search's best lowered again (a timer the search's end cut short is replaced), and the rounds,
    as long as the defaults' took; at most a share of the budget."""
    defaults = MappingOptions().to_json()
    plan = T._Budget(deadline=1000.0, budget=100.0)
    timed = SimpleNamespace(best=0.01, request_s={defaults: 0.05}, prepare_s={})
    rounds_s = T.DECISION_SETUP_S + T.DECISION_ROUNDS * 2 * 0.05
    assert plan.search_end(timed) == pytest.approx(1000.0 - rounds_s)  # the rounds, as long as the defaults'
    lowered = SimpleNamespace(best=0.01, request_s={defaults: 0.05}, prepare_s={defaults: 2.5})
    assert plan.search_end(lowered) == pytest.approx(1000.0 - rounds_s - 2 * 2.5)  # and lowering both again
    slow = SimpleNamespace(best=0.01, request_s={defaults: 5.0}, prepare_s={defaults: 2.5})
    assert plan.search_end(slow) == pytest.approx(1000.0 - T.DECISION_SHARE * 100.0)  # at most a share
    assert plan.search_end(SimpleNamespace(best=0.01, request_s={}, prepare_s={})) == \
        pytest.approx(1000.0 - T.DECISION_SHARE * 100)
    assert plan.search_end(SimpleNamespace(best=math.inf, request_s={}, prepare_s={})) == 1000.0  # nothing valid
    assert T._Budget(math.inf, None).search_end(timed) == math.inf


# ---- end to end: runners that report chosen times -----------------------------------------------

_calls: dict[str, int] = {}
_rng = np.random.default_rng(0)


def _reported(kernel: Any, inputs: list[np.ndarray], options: MappingOptions, searched_ms: float,
              final_ms: float) -> tuple[float, Any]:
    """Runs the candidate once (its outputs are checked) and reports the defaults at 1 ms and
    other options at ``searched_ms`` in their first two timings (the search's and the check's),
    then at ``final_ms``, with 5 % noise."""
    out = kernel(*inputs, backend="c", options=options)
    noise = math.exp(0.05 * _rng.standard_normal())
    if options == MappingOptions():
        return 1e-3 * noise, out
    text = options.to_json()
    _calls[text] = _calls.get(text, 0) + 1
    return (searched_ms if _calls[text] <= 2 else final_ms) * 1e-3 * noise, out


def defaults_fastest(kernel: Any, inputs: list[np.ndarray], options: MappingOptions, reps: int,
                     flush: np.ndarray) -> tuple[float, Any]:
    return _reported(kernel, inputs, options, 2.0, 2.0)


def lucky_in_the_search(kernel: Any, inputs: list[np.ndarray], options: MappingOptions, reps: int,
                        flush: np.ndarray) -> tuple[float, Any]:
    return _reported(kernel, inputs, options, 0.5, 1.0)


def truly_faster(kernel: Any, inputs: list[np.ndarray], options: MappingOptions, reps: int,
                 flush: np.ndarray) -> tuple[float, Any]:
    return _reported(kernel, inputs, options, 0.7, 0.7)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TuningCache:
    monkeypatch.setenv("TCDSL_TUNING_DB", str(tmp_path / "tuning.sqlite"))
    return TuningCache()


def _tune(runner: str) -> tuple[Any, T.TuneResult, list[np.ndarray]]:
    k = tc.define(MM)
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal(s).astype(np.float32) for s in ((24, 16), (16, 32)))
    result = k.autotune(A, B, generations=1, population=3, elites=1, seed=1, progress=False,
                        runner=f"test_tuner_decision:{runner}")
    return k, result, [A, B]


@pytest.mark.cpu
def test_a_search_whose_best_is_the_defaults_records_a_drop(db: TuningCache):
    k, result, arrays = _tune("defaults_fastest")
    assert result.options == MappingOptions() and result.candidate == MappingOptions()
    assert result.decision is not None and not result.decision.keep and result.decision.rounds == 0
    assert "the defaults were the search's best" in result.explain()
    entry = db.best(T.key_for(k, arrays))
    assert entry is not None and MappingOptions.from_json(entry.options) == MappingOptions()


@pytest.mark.cpu
def test_a_best_that_only_won_by_luck_in_the_search_is_dropped(db: TuningCache):
    k, result, arrays = _tune("lucky_in_the_search")
    assert result.candidate is not None and result.candidate != MappingOptions()
    d = result.decision
    assert d is not None and not d.keep and d.rounds >= LOOKS[0], d
    assert result.options == MappingOptions() and 0.8e-3 < result.time_s < 1.25e-3
    explained = result.explain()
    assert f"in {d.rounds} interleaved rounds" in explained and "the defaults stay" in explained, explained
    entry = db.best(T.key_for(k, arrays))
    assert entry is not None and MappingOptions.from_json(entry.options) == MappingOptions()


@pytest.mark.cpu
def test_a_best_faster_in_the_final_rounds_is_kept(db: TuningCache):
    k, result, arrays = _tune("truly_faster")
    d = result.decision
    assert d is not None and d.keep and d.rounds == LOOKS[0] and d.speedup == pytest.approx(1 / 0.7, rel=0.1)
    assert result.options == result.candidate != MappingOptions()
    assert result.speedup == pytest.approx(1 / 0.7, rel=0.1)
    assert "kept: won" in result.explain() and "differs from the defaults in:" in result.explain()
    assert k._tuned_for(arrays) == result.options


def test_median_interval_is_the_binomial_order_statistics() -> None:
    # values 1..n: the k-th smallest is k; 95 % intervals from binomial tables
    for n, j in ((6, 1), (10, 2), (15, 4), (20, 6), (30, 10), (40, 14)):
        assert median_interval(range(1, n + 1)) == (j, n + 1 - j)
    assert median_interval(list(range(7, 0, -1))) == (1, 7)  # unsorted input
    assert median_interval(range(1, 6)) is None and median_interval([]) is None  # too few for 95 %
    assert median_interval(range(1, 6), level=0.9) == (1, 5)


def test_median_interval_covers_the_median_as_often_as_it_says() -> None:
    rng = np.random.default_rng(3)
    draws = 4000  # lognormal rounds, skewed as a noisy host's times: the true median is exp(0) = 1
    hits = 0
    for _ in range(draws):
        got = median_interval(rng.lognormal(0.0, 1.0, 15))
        assert got is not None
        hits += got[0] <= 1.0 <= got[1]
    # exact coverage at n = 15 is 1 - 2 P(Bin(15, 1/2) <= 3) = 0.9648; 4000 draws: sd 0.003
    assert 0.95 <= hits / draws <= 0.98
