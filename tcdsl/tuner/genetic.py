"""Genetic search, the engine of the autotuner: a ``Space`` of discrete ``Gene``s and a cost function
(seconds; ``inf`` = invalid) go in, a ``SearchResult`` (best ``Genome``, its cost, one ``Generation`` record
per generation) comes out. It knows nothing about compiling, and it resumes exactly from its JSON ``state()``."""

from __future__ import annotations

import itertools
import json
import math
import numbers
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

Genome = tuple[int, ...]
"""One index into each gene's choices, in the order of ``Space.genes``."""

_STATE_VERSION = 1
_RETRIES = 20  # breeding attempts for one population slot before falling back to a random genome


def _choice_key(value: Any) -> str:
    """The canonical JSON text of a choice. ``encode`` matches values by it, so ``1``, ``1.0`` and ``True``
    are different choices, while a tuple and the list that JSON turns it into are the same one."""
    return json.dumps(value, sort_keys=True, allow_nan=False)


@dataclass(frozen=True)
class Gene:
    """One knob of the space: a name and its allowed values (JSON-serialisable, distinct, at least one)."""

    name: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        if not self.choices:
            raise ValueError(f"gene {self.name!r} has no choices")
        try:
            keys = [_choice_key(c) for c in self.choices]
        except (TypeError, ValueError) as e:
            raise ValueError(f"gene {self.name!r}: every choice must be JSON-serialisable ({e})") from None
        if len(set(keys)) != len(keys):
            raise ValueError(f"gene {self.name!r} has duplicate choices: {self.choices!r}")

    def index(self, value: Any) -> int:
        """The index of ``value`` among the choices (exact match, see ``_choice_key``)."""
        try:
            key = _choice_key(value)
        except (TypeError, ValueError):
            key = None
        for i, choice in enumerate(self.choices):
            if _choice_key(choice) == key:
                return i
        raise ValueError(f"gene {self.name!r}: {value!r} is not one of its choices {self.choices!r}")


@dataclass(frozen=True)
class Space:
    """The search space: the product of its genes' choices."""

    genes: tuple[Gene, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "genes", tuple(self.genes))
        names = [g.name for g in self.genes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate gene names in the space: {', '.join(dupes)}")

    def decode(self, g: Genome) -> dict[str, Any]:
        """``{gene name: chosen value}`` for a genome."""
        g = self._check(g)
        return {gene.name: gene.choices[i] for gene, i in zip(self.genes, g)}

    def encode(self, values: Mapping[str, Any]) -> Genome:
        """The genome choosing ``values``; a missing or unknown name, or a value that is not a choice, is an error."""
        names = {gene.name for gene in self.genes}
        missing = [gene.name for gene in self.genes if gene.name not in values]
        if missing:
            raise ValueError(f"no value given for gene(s): {', '.join(missing)}")
        unknown = sorted(str(k) for k in values if k not in names)
        if unknown:
            raise ValueError(f"no gene named: {', '.join(unknown)}")
        return tuple(gene.index(values[gene.name]) for gene in self.genes)

    def random(self, rng: random.Random) -> Genome:
        """A uniformly random genome drawn from ``rng``."""
        return tuple(rng.randrange(len(gene.choices)) for gene in self.genes)

    def size(self) -> int:
        """The number of distinct genomes."""
        return math.prod(len(gene.choices) for gene in self.genes)

    def _all(self) -> Iterator[Genome]:
        """Every genome, in lexicographic order."""
        return itertools.product(*(range(len(gene.choices)) for gene in self.genes))

    def _check(self, g: Sequence[int]) -> Genome:
        """``g`` as a genome of this space (a list from JSON is accepted), or ValueError saying what is wrong."""
        g = tuple(g)
        if len(g) != len(self.genes):
            raise ValueError(f"genome {g!r} has {len(g)} genes, the space has {len(self.genes)}")
        for gene, i in zip(self.genes, g):
            if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < len(gene.choices):
                raise ValueError(f"genome {g!r}: gene {gene.name!r} index {i!r} is not in [0, {len(gene.choices)})")
        return tuple(int(i) for i in g)


@dataclass(frozen=True)
class GAConfig:
    """The knobs of the genetic search; validated on construction."""

    generations: int = 25
    population: int = 100
    crossover: float = 0.8  # fraction of children made by crossover of two parents (others: a copy of one parent)
    mutation: float = 0.07  # per-gene probability of replacing a child's gene by a different random choice
    elites: int = 10  # best genomes carried over unchanged
    tournament: int = 3  # tournament size for parent selection
    patience: int | None = 5  # stop when the best has not improved for this many generations (None: never)
    budget_s: float | None = None  # stop when this much wall time has passed (checked between generations)
    seed: int | None = None

    def __post_init__(self) -> None:
        problems = [
            f"generations must be >= 1, got {self.generations}" if self.generations < 1 else "",
            f"population must be >= 2, got {self.population}" if self.population < 2 else "",
            f"elites must be in [0, population={self.population}), got {self.elites}"
            if not 0 <= self.elites < self.population
            else "",
            f"crossover must be in [0, 1], got {self.crossover}" if not 0.0 <= self.crossover <= 1.0 else "",
            f"mutation must be in [0, 1], got {self.mutation}" if not 0.0 <= self.mutation <= 1.0 else "",
            f"tournament must be >= 1, got {self.tournament}" if self.tournament < 1 else "",
            f"patience must be >= 1 or None, got {self.patience}"
            if self.patience is not None and self.patience < 1
            else "",
            f"budget_s must be >= 0 or None, got {self.budget_s}"
            if self.budget_s is not None and not self.budget_s >= 0
            else "",
        ]
        problems = [p for p in problems if p]
        if problems:
            raise ValueError("invalid GAConfig: " + "; ".join(problems))


_DEFAULT_CONFIG = GAConfig()


@dataclass(frozen=True)
class Generation:
    """What one generation did."""

    number: int  # 0-based
    best_cost: float  # best cost found so far (inf if none valid)
    median_cost: float  # median over this generation's valid costs (inf if none)
    evaluated: int  # new evaluations run this generation (cache hits not counted)
    invalid: int  # candidates of this generation with cost inf
    seconds: float  # wall time of this generation


@dataclass
class SearchResult:
    """The outcome of ``GeneticSearch.run``."""

    best: Genome | None
    best_cost: float
    generations: list[Generation]
    evaluations: int
    stopped: str  # "generations", "patience", "budget", "interrupted" or "exhausted"
    costs: dict[Genome, float]  # every genome evaluated and its cost, in evaluation order


Evaluate = Callable[[list[Genome]], Sequence[float]]
OnGeneration = Callable[[Generation, "GeneticSearch"], None]


def _sanitise(cost: Any) -> float:
    """A cost as a float; NaN and negative costs mean an invalid candidate, i.e. inf."""
    c = float(cost)
    return math.inf if math.isnan(c) or c < 0 else c


def _encode_cost(c: float) -> float | None:
    return None if math.isinf(c) else c


def _decode_cost(c: float | None) -> float:
    return math.inf if c is None else float(c)


def _encode_generation(h: Generation) -> dict[str, Any]:
    return {**asdict(h), "best_cost": _encode_cost(h.best_cost), "median_cost": _encode_cost(h.median_cost)}


def _decode_generation(h: Mapping[str, Any]) -> Generation:
    return Generation(**{**h, "best_cost": _decode_cost(h["best_cost"]), "median_cost": _decode_cost(h["median_cost"])})


class GeneticSearch:
    """Minimises ``evaluate`` over ``space``: one ``evaluate`` call per generation with the genomes whose cost is
    not known yet, elitism, tournament selection, uniform crossover and per-gene mutation."""

    def __init__(
        self,
        space: Space,
        evaluate: Evaluate,
        config: GAConfig = _DEFAULT_CONFIG,
        seeds: Sequence[Genome] = (),
        viable: Callable[[Genome], bool] | None = None,
    ) -> None:
        self._setup(space, evaluate, config, viable)
        self._population = self._first_population([space._check(s) for s in seeds])

    def _setup(self, space: Space, evaluate: Evaluate, config: GAConfig,
               viable: Callable[[Genome], bool] | None = None) -> None:
        self.space = space
        # genomes not worth evaluating (a register tile that would spill) are drawn again, up to
        # _RETRIES times per slot, so that they do not fill the population
        self.viable = viable or (lambda _g: True)
        self.evaluate = evaluate
        self.config = config
        self._rng = random.Random(config.seed)
        self._number = 0  # the generation the population belongs to
        self._evaluated = False  # whether that generation has been evaluated and recorded
        self._population = []
        self._costs: dict[Genome, float] = {}
        self._history: list[Generation] = []
        self._best: Genome | None = None
        self._best_cost = math.inf
        self._stale = 0  # generations since the best last improved
        self._elapsed = 0.0  # seconds spent in earlier run() calls
        self._started: float | None = None  # time.monotonic() when the current run() began

    # -- read-only views, for on_generation callbacks --

    @property
    def population(self) -> tuple[Genome, ...]:
        """The current population, in evaluation order (elites first)."""
        return tuple(self._population)

    @property
    def costs(self) -> Mapping[Genome, float]:
        """Every genome evaluated so far and its cost."""
        return MappingProxyType(self._costs)

    @property
    def best(self) -> Genome | None:
        return self._best

    # -- the search loop --

    def run(self, on_generation: OnGeneration | None = None) -> SearchResult:
        """Search until a stop condition holds; a KeyboardInterrupt in ``evaluate`` or ``on_generation`` ends the
        search with ``stopped="interrupted"`` and keeps what was found."""
        self._started = time.monotonic()
        try:
            stopped = self._loop(on_generation)
        except KeyboardInterrupt:
            stopped = "interrupted"
        finally:
            self._elapsed = self._elapsed_now()
            self._started = None
        return SearchResult(
            best=self._best,
            best_cost=self._best_cost,
            generations=list(self._history),
            evaluations=len(self._costs),
            stopped=stopped,
            costs=dict(self._costs),
        )

    def _loop(self, on_generation: OnGeneration | None) -> str:
        while True:
            started = time.monotonic()
            if self._evaluated:
                reason = self._stop_reason()
                if reason is not None:
                    return reason
                self._next_generation()
            generation = self._evaluate_generation(started)
            if on_generation is not None:
                on_generation(generation, self)

    def _stop_reason(self) -> str | None:
        cfg = self.config
        if len(self._costs) >= self.space.size():
            return "exhausted"
        if self._number + 1 >= cfg.generations:
            return "generations"
        if cfg.patience is not None and self._stale >= cfg.patience:
            return "patience"
        if cfg.budget_s is not None and self._elapsed_now() >= cfg.budget_s:
            return "budget"
        return None

    def _elapsed_now(self) -> float:
        return self._elapsed + (time.monotonic() - self._started if self._started is not None else 0.0)

    def _next_generation(self) -> None:
        """Breed the next population; an interrupt while breeding leaves the state as it was."""
        rng_state = self._rng.getstate()
        try:
            population = self._breed()
        except KeyboardInterrupt:
            self._rng.setstate(rng_state)
            raise
        self._population, self._number, self._evaluated = population, self._number + 1, False

    def _evaluate_generation(self, started: float) -> Generation:
        """Evaluate the population's new genomes (one ``evaluate`` call) and record the generation."""
        previous_best = self._best_cost
        new = [g for g in self._population if g not in self._costs]
        if new:
            costs = list(self.evaluate(list(new)))
            if len(costs) != len(new):
                raise ValueError(f"evaluate returned {len(costs)} costs for {len(new)} genomes")
            for g, raw in zip(new, costs):
                cost = _sanitise(raw)
                self._costs[g] = cost
                if cost < self._best_cost:
                    self._best, self._best_cost = g, cost
        population_costs = [self._costs[g] for g in self._population]
        valid = [c for c in population_costs if not math.isinf(c)]
        generation = Generation(
            number=self._number,
            best_cost=self._best_cost,
            median_cost=float(statistics.median(valid)) if valid else math.inf,
            evaluated=len(new),
            invalid=len(population_costs) - len(valid),
            seconds=time.monotonic() - started,
        )
        self._history.append(generation)
        self._evaluated = True
        self._stale = 0 if self._number == 0 or self._best_cost < previous_best else self._stale + 1
        return generation

    # -- population and breeding --

    def _first_population(self, seeds: list[Genome]) -> list[Genome]:
        """The seeds (deduplicated, at most ``population``), then random genomes up to ``population`` distinct
        ones, or the whole space in a random order when it is smaller."""
        population = list(dict.fromkeys(seeds))[: self.config.population]
        seen = set(population)
        target = min(self.config.population, self.space.size())
        if target == self.space.size():
            rest = [g for g in self.space._all() if g not in seen]
            self._rng.shuffle(rest)
            return population + rest
        tries = 0
        while len(population) < target:
            g = self.space.random(self._rng)
            tries += 1
            if g not in seen and (self.viable(g) or tries > _RETRIES * target):
                population.append(g)
                seen.add(g)
        return population

    def _breed(self) -> list[Genome]:
        """The elites (best finite costs, unchanged), then distinct children; the population shrinks only when no
        new distinct genome can be found."""
        pop, costs = self._population, self._costs
        ranked = sorted((i for i, g in enumerate(pop) if not math.isinf(costs[g])), key=lambda i: (costs[pop[i]], i))
        population = [pop[i] for i in ranked[: self.config.elites]]
        seen = set(population)
        target = min(self.config.population, self.space.size())
        while len(population) < target:
            child = self._distinct_child(seen)
            if child is None:
                break
            population.append(child)
            seen.add(child)
        return population

    def _distinct_child(self, seen: set[Genome]) -> Genome | None:
        """A viable child not in ``seen``: bred if possible, else a random genome (an immigrant), else
        any new one, else None."""
        fallback = None
        for make in (self._child, lambda: self.space.random(self._rng)):
            for _ in range(_RETRIES):
                child = make()
                if child not in seen:
                    if self.viable(child):
                        return child
                    fallback = fallback or child
        return fallback

    def _child(self) -> Genome:
        rng = self._rng
        if rng.random() < self.config.crossover:
            a, b = self._select(), self._select()
            child = tuple(x if rng.random() < 0.5 else y for x, y in zip(a, b))
        else:
            child = self._select()
        return self._mutate(child)

    def _select(self) -> Genome:
        """Tournament selection: the lowest cost among ``tournament`` random picks (ties: the first picked)."""
        pop, rng = self._population, self._rng
        winner = pop[rng.randrange(len(pop))]
        for _ in range(self.config.tournament - 1):
            g = pop[rng.randrange(len(pop))]
            if self._costs[g] < self._costs[winner]:
                winner = g
        return winner

    def _mutate(self, g: Genome) -> Genome:
        """Replace each gene, with probability ``mutation``, by a different random choice."""
        genes = list(g)
        for i, gene in enumerate(self.space.genes):
            n = len(gene.choices)
            if self._rng.random() < self.config.mutation and n > 1:
                j = self._rng.randrange(n - 1)
                genes[i] = j + (j >= genes[i])
        return tuple(genes)

    # -- checkpoints --

    def state(self) -> dict[str, Any]:
        """A JSON-serialisable checkpoint (no inf or NaN in it); ``from_state`` continues exactly from it."""
        version, internal, gauss_next = self._rng.getstate()
        return {
            "version": _STATE_VERSION,
            "genes": [[gene.name, len(gene.choices)] for gene in self.space.genes],
            "generation": self._number,
            "evaluated": self._evaluated,
            "population": [list(g) for g in self._population],
            "costs": [[list(g), _encode_cost(c)] for g, c in self._costs.items()],
            "history": [_encode_generation(h) for h in self._history],
            "best": None if self._best is None else list(self._best),
            "best_cost": _encode_cost(self._best_cost),
            "stale": self._stale,
            "elapsed": self._elapsed_now(),
            "rng": [version, list(internal), gauss_next],
        }

    @classmethod
    def from_state(cls, space: Space, evaluate: Evaluate, config: GAConfig, state: Mapping[str, Any],
                   viable: Callable[[Genome], bool] | None = None) -> GeneticSearch:
        """The search checkpointed in ``state``; the space must have the same gene names and choice counts."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported genetic-search state version {state.get('version')!r}")
        genes = [[gene.name, len(gene.choices)] for gene in space.genes]
        if [list(x) for x in state["genes"]] != genes:
            raise ValueError(f"the state was taken on a different space: {state['genes']!r} vs {genes!r}")
        search = cls.__new__(cls)
        search._setup(space, evaluate, config, viable)
        search._number = int(state["generation"])
        search._evaluated = bool(state["evaluated"])
        search._population = [space._check(g) for g in state["population"]]
        search._costs = {space._check(g): _decode_cost(c) for g, c in state["costs"]}
        search._history = [_decode_generation(h) for h in state["history"]]
        search._best = None if state["best"] is None else space._check(state["best"])
        search._best_cost = _decode_cost(state["best_cost"])
        search._stale = int(state["stale"])
        search._elapsed = float(state["elapsed"])
        version, internal, gauss_next = state["rng"]
        search._rng.setstate((version, tuple(internal), gauss_next))
        return search
