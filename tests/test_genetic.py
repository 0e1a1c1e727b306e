"""Genetic search (tcdsl.tuner.genetic) on a synthetic cost: 6 genes x 8 choices, a separable quadratic bowl
with a known optimum, and one candidate in eight invalid (inf, NaN or a negative time). Pure Python."""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from tcdsl.tuner.genetic import GAConfig, Gene, Generation, GeneticSearch, Genome, SearchResult, Space

TARGET: Genome = (3, 5, 1, 7, 0, 4)
SPACE = Space(tuple(Gene(f"g{i}", tuple(range(8))) for i in range(6)))


def invalid(g: Genome) -> bool:
    return (3 * g[2] + g[4]) % 8 == 5


def cost(g: Genome) -> float:
    """1 + squared distance to TARGET + a small tie-breaking term; invalid genomes report inf, NaN or -1."""
    if invalid(g):
        return (math.inf, math.nan, -1.0)[g[5] % 3]
    return 1.0 + sum((x - t) ** 2 for x, t in zip(g, TARGET)) + 1e-3 * sum(g)


OPTIMUM = cost(TARGET)  # 1.020; every other valid genome costs at least 2.0


class Recorder:
    """A deterministic evaluate that logs every batch it is given."""

    def __init__(self, fn: Any = cost, sleep_s: float = 0.0) -> None:
        self.fn = fn
        self.sleep_s = sleep_s
        self.batches: list[list[Genome]] = []

    def __call__(self, genomes: list[Genome]) -> list[float]:
        self.batches.append(list(genomes))
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return [self.fn(g) for g in genomes]

    @property
    def sequence(self) -> list[Genome]:
        return [g for batch in self.batches for g in batch]


def populations(search_config: GAConfig, space: Space = SPACE) -> tuple[SearchResult, list[tuple[Genome, ...]]]:
    """Run a search and return its result and the population of every generation."""
    pops: list[tuple[Genome, ...]] = []
    search = GeneticSearch(space, Recorder(), search_config)
    result = search.run(lambda gen, s: pops.append(s.population))
    return result, pops


def without_seconds(generations: Sequence[Generation]) -> list[Generation]:
    return [replace(g, seconds=0.0) for g in generations]


def same_result(a: SearchResult, b: SearchResult) -> None:
    assert a.best == b.best
    assert a.best_cost == b.best_cost
    assert a.stopped == b.stopped
    assert a.evaluations == b.evaluations
    assert list(a.costs.items()) == list(b.costs.items())
    assert without_seconds(a.generations) == without_seconds(b.generations)


def random_search_best(n: int, seed: int) -> float:
    rng = random.Random(seed)
    best = math.inf
    for _ in range(n):
        c = cost(SPACE.random(rng))
        if not math.isnan(c) and c >= 0:
            best = min(best, c)
    return best


# 1. quality


@pytest.mark.parametrize("seed", range(5))
def test_finds_optimum_and_beats_random_search(seed: int) -> None:
    result = GeneticSearch(SPACE, Recorder(), GAConfig(seed=seed)).run()
    assert result.best == TARGET
    assert result.best_cost == pytest.approx(1.02)
    # far fewer evaluations than the 262144 genomes of the space
    assert result.evaluations <= 2500 and result.evaluations == len(result.costs)
    random_best = random_search_best(result.evaluations, seed)
    assert result.best_cost <= random_best
    assert random_best >= 2.0  # random sampling of ~1000 genomes does not hit the single optimum


def test_random_search_is_much_worse_on_average() -> None:
    ga = [GeneticSearch(SPACE, Recorder(), GAConfig(seed=s)).run() for s in range(5)]
    mean_random = sum(random_search_best(r.evaluations, s + 100) for s, r in enumerate(ga)) / len(ga)
    mean_ga = sum(r.best_cost for r in ga) / len(ga)
    assert mean_ga == pytest.approx(OPTIMUM)
    assert mean_random > mean_ga + 1.0


# 2. reproducibility


def test_same_seed_same_search() -> None:
    a, b = Recorder(), Recorder()
    ra = GeneticSearch(SPACE, a, GAConfig(seed=7)).run()
    rb = GeneticSearch(SPACE, b, GAConfig(seed=7)).run()
    assert a.batches == b.batches
    same_result(ra, rb)
    c = Recorder()
    GeneticSearch(SPACE, c, GAConfig(seed=8)).run()
    assert c.sequence != a.sequence
    assert c.batches[0] != a.batches[0]


def test_one_evaluate_call_per_generation_in_population_order() -> None:
    rec = Recorder()
    pops: list[tuple[Genome, ...]] = []
    result = GeneticSearch(SPACE, rec, GAConfig(seed=3)).run(lambda gen, s: pops.append(s.population))
    assert len(rec.batches) == len(result.generations) == len(pops)
    seen: set[Genome] = set()
    for batch, pop, gen in zip(rec.batches, pops, result.generations):
        assert batch == [g for g in pop if g not in seen]
        assert gen.evaluated == len(batch)
        assert len(set(pop)) == len(pop) == 100
        seen.update(batch)
    assert rec.batches[0] == list(pops[0])  # generation 0: everything is new


# 3. crossover


def explained_by_two(child: Genome, parents: Sequence[Genome]) -> bool:
    return any(
        all(c in (a[i], b[i]) for i, c in enumerate(child)) for k, a in enumerate(parents) for b in parents[k + 1 :]
    )


def test_crossover_mixes_two_parents() -> None:
    _, pops = populations(GAConfig(seed=11, population=20, elites=0, mutation=0.0, crossover=1.0, generations=2))
    gen0, gen1 = pops[0], pops[1]
    new = [c for c in gen1 if c not in gen0]
    assert len(new) >= 12  # most children are new genomes (18 of 20 with this seed)
    for child in new:  # no mutation: every gene comes from one of two generation-0 parents
        assert all(any(p[i] == v for p in gen0) for i, v in enumerate(child))
        assert explained_by_two(child, gen0)


def test_no_crossover_no_mutation_only_copies() -> None:
    config = GAConfig(seed=11, population=20, elites=0, mutation=0.0, crossover=0.0, generations=1)
    search = GeneticSearch(SPACE, Recorder(), config)
    search.run()
    gen0 = set(search.population)
    children = [search._child() for _ in range(200)]
    assert set(children) <= gen0
    # tournament selection of size 3 favours the better genomes
    assert statistics.median(search.costs[c] for c in children) < statistics.median(search.costs[g] for g in gen0)


def test_mutation_changes_every_gene() -> None:
    # mutation=1 and no crossover: each child differs from its (copied) parent in every gene
    _, pops = populations(GAConfig(seed=5, population=20, elites=0, mutation=1.0, crossover=0.0, generations=2))
    for child in pops[1]:
        assert any(all(c != p for c, p in zip(child, parent)) for parent in pops[0])


# 4. elites


def test_elites_survive_and_best_never_worsens() -> None:
    result, pops = populations(GAConfig(seed=2, patience=None, generations=12))
    assert len(pops) == 12 and result.stopped == "generations"
    costs = result.costs
    for k in range(len(pops) - 1):
        valid = sorted((costs[g], i) for i, g in enumerate(pops[k]) if not math.isinf(costs[g]))
        best_k = pops[k][valid[0][1]]
        assert best_k in pops[k + 1]
        assert pops[k + 1][0] == best_k  # elites come first, best first
        elites = [pops[k][i] for _, i in valid[:10]]
        assert list(pops[k + 1][:10]) == elites
    best_costs = [g.best_cost for g in result.generations]
    assert all(b <= a for a, b in zip(best_costs, best_costs[1:]))
    assert best_costs[-1] == result.best_cost == min(c for c in costs.values())


# 5. memoisation


def test_no_genome_evaluated_twice() -> None:
    calls: Counter[Genome] = Counter()

    def evaluate(genomes: list[Genome]) -> list[float]:
        calls.update(genomes)
        return [math.inf if g[0] == g[1] == 3 else 1.0 + sum((x - 1) ** 2 for x in g) for g in genomes]

    # a small space and many generations force the population to revisit genomes
    space = Space(tuple(Gene(f"g{i}", tuple(range(4))) for i in range(4)))
    result = GeneticSearch(space, evaluate, GAConfig(seed=1, population=30, patience=None, generations=30)).run()
    assert calls and max(calls.values()) == 1
    assert sum(calls.values()) == result.evaluations == len(result.costs)
    assert sum(g.evaluated for g in result.generations) == result.evaluations
    assert any(g.evaluated < 30 for g in result.generations[1:])  # later generations hit the cache


# 6. invalid candidates


def test_invalid_candidates_counted_and_never_best() -> None:
    result, pops = populations(GAConfig(seed=4))
    assert any(math.isnan(cost(g)) for g in result.costs) and any(cost(g) == -1.0 for g in result.costs)
    for gen, pop in zip(result.generations, pops):
        assert gen.invalid == sum(invalid(g) for g in pop)
        valid = sorted(cost(g) for g in pop if not invalid(g))
        n = len(valid)
        median = valid[n // 2] if n % 2 else (valid[n // 2 - 1] + valid[n // 2]) / 2
        assert gen.median_cost == pytest.approx(median)
    assert result.generations[0].invalid > 0
    for g, c in result.costs.items():  # NaN and negative costs are stored as inf
        assert (c == math.inf) == invalid(g)
    assert result.best is not None and not invalid(result.best)


def test_all_invalid() -> None:
    rec = Recorder(lambda g: (math.inf, math.nan, -3.0)[sum(g) % 3])
    result = GeneticSearch(SPACE, rec, GAConfig(seed=0, population=20, patience=3)).run()
    assert result.best is None and result.best_cost == math.inf
    assert result.stopped == "patience" and len(result.generations) == 4
    assert all(g.invalid == 20 and g.median_cost == math.inf and g.best_cost == math.inf for g in result.generations)
    assert all(c == math.inf for c in result.costs.values())


def test_evaluate_must_return_one_cost_per_genome() -> None:
    with pytest.raises(ValueError, match="returned 1 costs for 10 genomes"):
        GeneticSearch(SPACE, lambda gs: [1.0], GAConfig(seed=0, population=10, elites=2)).run()


# 7. checkpoint and resume


def test_resume_from_on_generation_interrupt_matches_uninterrupted_run() -> None:
    config = GAConfig(seed=9, patience=None, generations=10)
    full_rec = Recorder()
    full = GeneticSearch(SPACE, full_rec, config).run()
    assert full.stopped == "generations" and len(full.generations) == 10

    saved: dict[str, Any] = {}

    def stop_after_3(gen: Generation, search: GeneticSearch) -> None:
        if gen.number == 3:
            saved.update(search.state())
            raise KeyboardInterrupt

    first_rec = Recorder()
    first = GeneticSearch(SPACE, first_rec, config).run(stop_after_3)
    assert first.stopped == "interrupted" and len(first.generations) == 4
    assert first.best_cost == full.generations[3].best_cost
    text = json.dumps(saved, allow_nan=False)  # no inf/NaN in the checkpoint
    rest_rec = Recorder()
    rest = GeneticSearch.from_state(SPACE, rest_rec, config, json.loads(text)).run()
    assert first_rec.sequence + rest_rec.sequence == full_rec.sequence
    assert first_rec.batches + rest_rec.batches == full_rec.batches
    same_result(rest, full)


def test_resume_from_evaluate_interrupt_and_result_state() -> None:
    config = GAConfig(seed=21, patience=None, generations=8)
    full_rec = Recorder()
    full = GeneticSearch(SPACE, full_rec, config).run()

    calls = 0

    def flaky(genomes: list[Genome]) -> list[float]:
        nonlocal calls
        calls += 1
        if calls == 5:  # Ctrl-C while generation 4 is being evaluated
            raise KeyboardInterrupt
        return [cost(g) for g in genomes]

    search = GeneticSearch(SPACE, flaky, config)
    first = search.run()
    assert first.stopped == "interrupted" and len(first.generations) == 4
    assert first.best is not None and first.best_cost == full.generations[3].best_cost
    state = json.loads(json.dumps(search.state(), allow_nan=False))
    rest_rec = Recorder()
    rest = GeneticSearch.from_state(SPACE, rest_rec, config, state).run()
    assert full_rec.batches[4:] == rest_rec.batches
    same_result(rest, full)


def test_resume_after_generations_with_a_larger_limit() -> None:
    long_rec = Recorder()
    long = GeneticSearch(SPACE, long_rec, GAConfig(seed=5, patience=None, generations=9)).run()
    short_search = GeneticSearch(SPACE, Recorder(), GAConfig(seed=5, patience=None, generations=4))
    assert short_search.run().stopped == "generations"
    state = json.loads(json.dumps(short_search.state()))
    more_rec = Recorder()
    more = GeneticSearch.from_state(SPACE, more_rec, GAConfig(seed=5, patience=None, generations=9), state).run()
    assert more_rec.batches == long_rec.batches[4:]
    same_result(more, long)


def test_state_checks_the_space() -> None:
    search = GeneticSearch(SPACE, Recorder(), GAConfig(seed=0, generations=1))
    search.run()
    other = Space(tuple(Gene(f"g{i}", tuple(range(7))) for i in range(6)))
    with pytest.raises(ValueError, match="different space"):
        GeneticSearch.from_state(other, Recorder(), GAConfig(), search.state())


# 8. stop conditions


def test_patience_stops_on_a_flat_cost() -> None:
    result = GeneticSearch(SPACE, Recorder(lambda g: 1.0), GAConfig(seed=0, patience=4)).run()
    assert result.stopped == "patience"
    assert len(result.generations) == 5  # generation 0 sets the best, then 4 without improvement
    assert result.best_cost == 1.0
    assert result.best == next(iter(result.costs))  # ties: the first genome evaluated stays the best


def test_budget_stops() -> None:
    rec = Recorder(sleep_s=0.02)
    started = time.monotonic()
    result = GeneticSearch(SPACE, rec, GAConfig(seed=0, patience=None, budget_s=0.05)).run()
    assert result.stopped == "budget"
    assert 1 <= len(result.generations) <= 4
    assert time.monotonic() - started < 1.0
    assert result.best is not None and result.best_cost < math.inf


def test_budget_is_carried_through_state() -> None:
    config = GAConfig(seed=0, patience=None, generations=3, budget_s=5.0)
    search = GeneticSearch(SPACE, Recorder(sleep_s=0.02), config)

    def interrupt(gen: Generation, s: GeneticSearch) -> None:
        raise KeyboardInterrupt

    assert search.run(interrupt).stopped == "interrupted"
    state = json.loads(json.dumps(search.state()))
    assert 0.02 <= state["elapsed"] < 5.0
    rec = Recorder()
    assert GeneticSearch.from_state(SPACE, rec, config, state).run().stopped == "generations"
    assert len(rec.batches) == 2
    state["elapsed"] = 5.0  # the budget was spent before the checkpoint: stop without evaluating anything
    rec = Recorder()
    spent = GeneticSearch.from_state(SPACE, rec, config, state).run()
    assert spent.stopped == "budget" and rec.batches == [] and len(spent.generations) == 1


def test_small_space_is_exhausted() -> None:
    space = Space((Gene("a", (1, 2, 3)), Gene("b", ("x", "y", "z"))))

    def evaluate(genomes: list[Genome]) -> list[float]:
        return [abs(a - 1) + abs(b - 0) + 0.5 for a, b in genomes]

    rec = Recorder(lambda g: evaluate([g])[0])
    result = GeneticSearch(space, rec, GAConfig(seed=0, population=20, elites=5)).run()
    assert result.stopped == "exhausted"
    assert result.evaluations == 9 and len(rec.batches) == 1 and len(result.generations) == 1
    assert result.best == (1, 0) and result.best_cost == 0.5
    assert space.decode(result.best) == {"a": 2, "b": "x"}


def test_space_slightly_larger_than_population_is_exhausted() -> None:
    space = Space((Gene("a", tuple(range(5))), Gene("b", tuple(range(5)))))
    rec = Recorder(lambda g: float(g[0] * 5 + g[1]) + 1.0)
    result = GeneticSearch(space, rec, GAConfig(seed=3, population=10, elites=2, patience=None, generations=200)).run()
    assert result.stopped == "exhausted" and result.evaluations == 25
    assert result.best == (0, 0) and result.best_cost == 1.0
    assert sorted(rec.sequence) == sorted(set(rec.sequence))


# 9. seeds


def test_optimal_seed_is_evaluated_first_and_wins() -> None:
    rec = Recorder()
    result = GeneticSearch(SPACE, rec, GAConfig(seed=0, generations=1), seeds=[TARGET, TARGET, (0,) * 6]).run()
    assert rec.batches[0][:2] == [TARGET, (0,) * 6]  # deduplicated, seeds first
    assert len(rec.batches[0]) == 100
    assert result.best == TARGET and result.best_cost == OPTIMUM
    assert result.stopped == "generations"


@pytest.mark.parametrize("seed", [(0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 8), (0, 0, 0, 0, 0, -1), (0, 0, 0, 0, 0, 1.5)])
def test_invalid_seed_raises(seed: Any) -> None:
    with pytest.raises(ValueError, match="genome"):
        GeneticSearch(SPACE, Recorder(), GAConfig(seed=0), seeds=[seed])


# 10. space and config


def test_encode_decode_round_trip() -> None:
    space = Space((Gene("tile", ((32, 32), (64, 16), None)), Gene("unroll", (1, 2, 4)), Gene("omp", (False, True))))
    assert space.size() == 18
    rng = random.Random(0)
    for _ in range(20):
        g = space.random(rng)
        assert space.encode(space.decode(g)) == g
    values = {"tile": (64, 16), "unroll": 4, "omp": True}
    assert space.encode(values) == (1, 2, 1)
    assert space.encode(json.loads(json.dumps(values))) == (1, 2, 1)  # a tuple read back from JSON as a list
    assert space.decode((2, 0, 0)) == {"tile": None, "unroll": 1, "omp": False}


def test_encode_errors() -> None:
    space = Space((Gene("unroll", (1, 2, 4)), Gene("omp", (False, True))))
    with pytest.raises(ValueError, match="unroll"):
        space.encode({"unroll": 3, "omp": True})
    with pytest.raises(ValueError, match="unroll"):
        space.encode({"unroll": 1.0, "omp": True})  # exact match: 1.0 is not the choice 1
    with pytest.raises(ValueError, match="omp"):
        space.encode({"unroll": 1, "omp": 1})  # nor is 1 the choice True
    with pytest.raises(ValueError, match="omp"):
        space.encode({"unroll": 1})
    with pytest.raises(ValueError, match="vector"):
        space.encode({"unroll": 1, "omp": True, "vector": 4})
    with pytest.raises(ValueError, match="unroll"):
        space.decode((3, 0))


def test_gene_and_space_validation() -> None:
    with pytest.raises(ValueError, match="no choices"):
        Gene("empty", ())
    with pytest.raises(ValueError, match="duplicate choices"):
        Gene("d", (1, 1))
    with pytest.raises(ValueError, match="JSON"):
        Gene("obj", (object(),))
    with pytest.raises(ValueError, match="duplicate gene names"):
        Space((Gene("a", (1,)), Gene("a", (2,))))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"population": 1}, "population"),
        ({"elites": 100}, "elites"),
        ({"elites": -1}, "elites"),
        ({"crossover": 1.5}, "crossover"),
        ({"mutation": -0.1}, "mutation"),
        ({"tournament": 0}, "tournament"),
        ({"generations": 0}, "generations"),
        ({"patience": 0}, "patience"),
        ({"budget_s": -1.0}, "budget_s"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        GAConfig(**kwargs)


def test_genomes_not_viable_are_drawn_again() -> None:
    """A predicate that rejects 7 genomes in 8 (as a register tile that would spill does): the first
    population and every bred one hold only viable genomes, and the search still finds the optimum
    among them."""
    viable = lambda g: g[0] == 3  # noqa: E731
    rec = Recorder()
    search = GeneticSearch(SPACE, rec, GAConfig(population=40, generations=8, seed=1), viable=viable)
    result = search.run()
    assert rec.sequence and all(viable(g) for g in rec.sequence)
    assert result.best is not None and result.best[0] == 3
    # without the predicate, about 7 in 8 of the first population would have been wasted on them
    first = GeneticSearch(SPACE, Recorder(), GAConfig(population=40, generations=1, seed=1)).population
    assert sum(not viable(g) for g in first) > 20
