"""The tuning driver: (kernel, arrays, settings) -> ``TuneResult``, the best ``MappingOptions`` found.

It builds the search space of the def at these sizes, seeds the genetic search with the default
options and with cached results of the same def, evaluates candidates safely (``evaluate``),
checkpoints the population after each generation, then keeps the best only if it beats the
defaults side by side (``decide``) and stores what it keeps in the tuning cache, from which later
calls of the kernel pick it up (``tuned_options``). A ``budget`` bounds the whole call, hung
compiles and the final rounds included (see ``Evaluator`` and ``_Budget``).
"""

from __future__ import annotations

import functools
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tcdsl import display, gpurt
from tcdsl.codegen import nvrtc, toolchain
from tcdsl.core.options import MappingOptions
from tcdsl.core.version import __version__

from . import space as S
from .cache import TuneEntry, TuneKey, TuningCache
from .decide import Decision, decide, sequential
from .evaluate import Evaluator, start_outputs
from .genetic import GAConfig, Generation, GeneticSearch, SearchResult

DECISION_SHARE = 0.25  # at most this share of a budget is held back for the final rounds against the defaults
DECISION_ROUNDS = 40  # the final rounds a budget holds time back for (the first two looks)
DECISION_SETUP_S = 2.0  # and this, for a timing process to restart (one that timed out is replaced) and load


@dataclass(repr=False)
class TuneResult:
    """What a search kept: the options and their time, the defaults' time, the history, and the
    final decision between the search's best (``candidate``) and the defaults."""

    options: MappingOptions
    time_s: float
    default_time_s: float
    generations: list[Generation]
    evaluations: int
    invalid: int
    stopped: str
    key: TuneKey
    rejected: list[tuple[str, str]] = field(default_factory=list)
    decision: Decision | None = None  # None: the search found nothing valid
    candidate: MappingOptions | None = None  # the search's best, which the decision kept or dropped

    def __repr__(self) -> str:
        kept = "the defaults" if self.options == MappingOptions() else ", ".join(self.options.changes())
        return (f"<TuneResult: {self.time_s * 1e3:.4g} ms, defaults {self.default_time_s * 1e3:.4g} ms "
                f"({self.speedup:.2f}x); {self.evaluations} candidates, {self.invalid} invalid, stopped by "
                f"{self.stopped}; kept {kept}>")

    @property
    def speedup(self) -> float:
        return self.default_time_s / self.time_s if self.time_s > 0 else math.inf

    def _repr_html_(self) -> str:
        """A summary table, the options kept and the plot (Jupyter's rich display)."""
        return display.tune_result(self)

    def explain(self) -> str:
        """The kept options, how they differ from the defaults, and the final decision's numbers."""
        lines = [f"best {self.time_s * 1e3:.3f} ms, defaults {self.default_time_s * 1e3:.3f} ms "
                 f"({self.speedup:.2f}x), {self.evaluations} candidates evaluated, {self.invalid} invalid, "
                 f"stopped by {self.stopped}"]
        if self.decision is not None:
            rounds = f" in {self.decision.rounds} interleaved rounds" if self.decision.rounds else ""
            lines.append(f"final check against the defaults{rounds}: {self.decision.why}")
        diff = _diff(self.options)
        dropped = _diff(self.candidate) if self.candidate is not None and self.options != self.candidate else []
        if diff:
            lines += ["differs from the defaults in:", *diff]
        elif dropped:
            lines += ["the defaults stay; the search's best differed from them in:", *dropped]
        else:
            lines.append("the defaults won")
        return "\n".join(lines)

    def plot(self, ax: Any = None) -> Any:
        """Best and median time per generation (matplotlib); returns the axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots()
        gens = [g.number for g in self.generations]
        ax.plot(gens, [g.best_cost * 1e3 for g in self.generations], marker="o", label="best")
        ax.plot(gens, [g.median_cost * 1e3 if math.isfinite(g.median_cost) else float("nan")
                       for g in self.generations], marker=".", label="median")
        ax.set_xlabel("generation")
        ax.set_ylabel("time (ms)")
        ax.legend()
        return ax


def _diff(options: MappingOptions) -> list[str]:
    return [f"  {c}" for c in options.changes()]


def machine() -> tuple[str, str]:
    """(device name, architecture) of this CPU, for the tuning cache's key: the model name, and the
    CPU target kernels compile for (``CpuTarget.key``: ISA, vector width, registers, caches;
    ``$TCDSL_CPU`` narrows it)."""
    return _model_name(), f"{platform.machine()} {toolchain.target().key}"


@functools.cache
def _model_name() -> str:
    """The CPU's model name from /proc/cpuinfo where it exists."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info.get("model name") or platform.processor() or platform.machine()


def device_for(backend: str) -> tuple[str, str, str]:
    """(device name, architecture, compiler) that results on ``backend`` depend on."""
    if backend == "opencl":
        cl, ctx, _ = gpurt.opencl()
        dev = ctx.devices[0]
        return dev.name, f"opencl-{dev.type}", f"{dev.platform.name} {dev.driver_version}"
    if backend == "cuda":
        target = gpurt.cuda_target()
        name = target.name
        if gpurt.cuda_available():
            import cupy

            name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        return name, target.name, "nvrtc {}.{}".format(*nvrtc.version())
    device, arch = machine()
    return device, arch, toolchain.compiler_version(tuple(toolchain.compiler()))


def key_for(kernel: Any, arrays: Sequence[np.ndarray], backend: str = "c") -> TuneKey:
    device, arch, compiler = device_for(backend)
    return TuneKey(tc=S.canonical_text(kernel.checked), entry=kernel.checked.name,
                   shapes=tuple(tuple(a.shape) for a in arrays), dtypes=tuple(a.dtype.str for a in arrays),
                   strides=tuple(tuple(s // a.itemsize for s in a.strides) for a in arrays),
                   backend=backend, device=device, arch=arch, compiler=compiler, version=__version__)


def tuned_entry(kernel: Any, arrays: Sequence[np.ndarray], cache: TuningCache | None = None,
                backend: str = "c") -> TuneEntry | None:
    """What a past search stored for this kernel, these arguments and backend (options, time
    measured, date), if any."""
    return (cache or TuningCache()).best(key_for(kernel, arrays, backend))


def tuned_options(kernel: Any, arrays: Sequence[np.ndarray], cache: TuningCache | None = None,
                  backend: str = "c") -> MappingOptions | None:
    """The options a past search stored for this kernel, these arguments and backend, if any."""
    entry = tuned_entry(kernel, arrays, cache, backend)
    return MappingOptions.from_json(entry.options) if entry is not None else None


def autotune(kernel: Any, arrays: Sequence[np.ndarray], *, generations: int = 25, population: int = 100,
             crossover: float = 0.8, mutation: float = 0.07, elites: int = 10, patience: int | None = 5,
             budget: float | None = None, seed: int | None = None, resume: bool = False,
             executor: Executor | None = None, cache: TuningCache | None = None, progress: bool = True,
             reps: int = 5, run_timeout: float = 60.0, compile_timeout: float = 300.0,
             runner: str = "tcdsl.tuner.evaluate:time_candidate", backend: str = "c",
             time_on: str = "local") -> TuneResult:
    """Search mapping options for ``kernel`` on ``arrays`` on ``backend`` (the C space, or TC's
    GPU options for "opencl" and "cuda"); see the module docstring."""
    deadline = time.monotonic() + budget if budget is not None else math.inf
    if backend == "cuda":
        gpurt._cupy()  # no device: say so now, not once per candidate
    cache = cache or TuningCache()
    checked = kernel.checked
    inst = kernel.instance(*arrays)
    space = S.space_for(checked, dict(inst.sizes)) if backend == "c" else S.gpu_space_for(checked, dict(inst.sizes))
    key = key_for(kernel, arrays, backend)
    config = GAConfig(generations=generations, population=population, crossover=crossover, mutation=mutation,
                      elites=min(elites, population - 1), patience=patience, budget_s=budget, seed=seed)
    reference = kernel(*arrays, backend="numpy", **start_outputs(kernel, arrays))
    reference = list(reference) if isinstance(reference, tuple) else [reference]
    if budget is not None:  # the search gets what the setup left
        config = replace(config, budget_s=max(0.0, deadline - time.monotonic()))
    evaluator = Evaluator(str(checked), list(arrays), reference, type(kernel).of_source, executor=executor, reps=reps,
                          run_timeout_s=run_timeout, compile_timeout_s=compile_timeout, runner=runner,
                          backend=backend, time_on=time_on, deadline=deadline)
    plan = _Budget(deadline, budget)
    bar = _Progress(config.generations, population, deadline if budget is not None else None, budget, progress)
    evaluate = _Evaluate(space, evaluator, plan, bar.candidate)
    seeds = _seeds(space, cache, key)
    search_budget = config.budget_s

    def on_generation(g: Generation, search: GeneticSearch) -> None:
        cache.save_checkpoint(key, search.state())
        bar.generation(g)
        evaluator.deadline = plan.search_end(evaluator)
        if evaluator.out_of_time():  # the search's share of the budget is spent: no generation of skips
            search.config = replace(search.config, budget_s=0.0)
            return
        if search_budget is not None:  # the time held back for the final rounds is not the search's
            held = deadline - plan.search_end(evaluator)
            search.config = replace(search.config, budget_s=max(0.0, search_budget - held))

    try:
        state = cache.load_checkpoint(key) if resume else None
        viable = functools.partial(_viable, space)
        search = (GeneticSearch.from_state(space, evaluate, config, state, viable) if state is not None
                  else GeneticSearch(space, evaluate, config, seeds, viable))
        result = search.run(on_generation)
        if result.stopped == "interrupted":  # the generation cut short: what it measured counts too
            for g, cost in evaluate.scored.items():
                result.costs.setdefault(g, cost)
                if cost < result.best_cost:
                    result.best, result.best_cost = g, cost
            result.evaluations = len(result.costs)
        bar.close()  # before the final timings, which print nothing
        evaluator.deadline = deadline  # the time held back is the final rounds'
        return _finish(result, space, key, cache, evaluator, evaluate.skipped)
    finally:
        bar.close()
        evaluator.close()


@dataclass(frozen=True)
class _Budget:
    """Splits a budget between the search and the final rounds against the defaults: the search
    ends ``DECISION_ROUNDS`` rounds (two timing requests each, as long as the defaults' took),
    ``DECISION_SETUP_S`` and twice the time the timer took to lower and load the defaults (a timer
    the search's end cut short is replaced, and the new one lowers the defaults and the search's
    best again: a maxpool's derived backward, ~2.5 s each) before the deadline, or
    ``DECISION_SHARE`` of the budget before it if that is less or the defaults are not timed yet.
    Nothing is held back while no candidate has a valid time: there is nothing to decide, and the
    evaluator's grace for a first valid time runs from the deadline."""

    deadline: float
    budget: float | None

    def search_end(self, evaluator: Evaluator) -> float:
        if self.budget is None or not math.isfinite(evaluator.best):
            return self.deadline
        most = DECISION_SHARE * self.budget
        defaults = MappingOptions().to_json()
        request = evaluator.request_s.get(defaults)
        if request is None:
            return self.deadline - most
        prepare = 2 * evaluator.prepare_s.get(defaults, 0.0)  # a replaced timer lowers both again
        return self.deadline - min(most, DECISION_SETUP_S + prepare + DECISION_ROUNDS * 2 * request)


class _Evaluate:
    """The search's cost function: pruned genomes are not compiled; once the evaluator is out of
    time (the search's share of the budget), the rest of a generation is skipped (scored inf,
    counted apart from the invalid), and so are the candidates its deadline stopped. Until a
    candidate has a valid time they go one at a time, the defaults first (``_seeds``): a small
    budget on a loaded machine then times the defaults alone within the deadline's grace rather
    than cutting a whole batch compiled together."""

    BATCH = 8  # candidates compiled together between deadline checks

    def __init__(self, space: S.Space, evaluator: Evaluator, budget: _Budget,
                 on_candidate: Callable[[float, str], None] = lambda _cost, _how: None) -> None:
        self.space, self.evaluator, self.budget = space, evaluator, budget
        self.skipped: set[S.Genome] = set()
        self.scored: dict[S.Genome, float] = {}  # every candidate scored so far, as soon as it is
        self.on_candidate = on_candidate  # (cost, "valid" | "invalid" | "skipped") per candidate

    def __call__(self, genomes: list[S.Genome]) -> list[float]:
        keep = [g for g in genomes if S.prune(self.space, g) is None]
        for g in genomes:
            if g not in keep:  # pruned (registers it would spill...): invalid, never compiled
                self.scored[g] = math.inf
                self.on_candidate(math.inf, "invalid")
        costs: dict[S.Genome, float] = {}
        i = 0
        while i < len(keep):
            size = self.BATCH if math.isfinite(self.evaluator.best) else 1
            batch, i = keep[i:i + size], i + size
            self.evaluator.deadline = self.budget.search_end(self.evaluator)
            if self.evaluator.out_of_time():
                self.skipped.update(batch)
                for _ in batch:
                    self.on_candidate(math.inf, "skipped")
                continue
            options = [S.to_options(self.space, g) for g in batch]
            self.evaluator.on_scored = functools.partial(self._scored, {o.to_json(): g for g, o in zip(batch, options)})
            costs.update(zip(batch, self.evaluator(options)))
            self.skipped.update(g for g, o in zip(batch, options) if o.to_json() in self.evaluator.cut)
        return [costs.get(g, math.inf) for g in genomes]

    def _scored(self, genomes: dict[str, S.Genome], text: str, cost: float) -> None:
        self.scored[genomes[text]] = cost
        how = "valid" if math.isfinite(cost) else "skipped" if text in self.evaluator.cut else "invalid"
        self.on_candidate(cost, how)


def _seeds(space: S.Space, cache: TuningCache, key: TuneKey) -> list[S.Genome]:
    """The defaults first, then the best options cached for this def at other sizes."""
    seeds = [S.from_options(space, MappingOptions())]
    for entry in cache.related(key.tc, key.entry, key.backend)[:10]:
        seeds.append(S.from_options(space, MappingOptions.from_json(entry.options)))
    return list(dict.fromkeys(g for g in seeds if g is not None))


def _finish(result: SearchResult, space: S.Space, key: TuneKey, cache: TuningCache, evaluator: Evaluator,
            skipped: set[S.Genome]) -> TuneResult:
    default = S.from_options(space, MappingOptions())
    default_time = result.costs.get(default, math.inf) if default is not None else math.inf
    invalid = sum(1 for g, c in result.costs.items() if not math.isfinite(c) and g not in skipped)
    candidate = (S.to_options(space, result.best) if result.best is not None and math.isfinite(result.best_cost)
                 else None)
    best, best_time, decision = MappingOptions(), default_time, None
    if candidate is not None:
        decision = _decision(candidate, result.stopped, evaluator)
        tuned_times = [t for t, _ in decision.pairs if math.isfinite(t)]
        default_times = [d for _, d in decision.pairs if math.isfinite(d)]
        if default_times:
            default_time = statistics.median(default_times)
        if decision.keep:
            best = candidate
            best_time = statistics.median(tuned_times) if tuned_times else result.best_cost
        else:
            best_time = default_time
        history = [{"generation": g.number, "best": g.best_cost, "median": g.median_cost if math.isfinite(
            g.median_cost) else None, "evaluated": g.evaluated, "invalid": g.invalid} for g in result.generations]
        if math.isfinite(best_time):
            cache.record(key, best.to_json(), best_time, result.evaluations, history)
    if result.stopped != "interrupted":
        cache.clear_checkpoint(key)
    return TuneResult(best, best_time, default_time, result.generations, result.evaluations - len(skipped),
                      invalid, result.stopped, key, list(evaluator.rejected), decision, candidate)


def _decision(candidate: MappingOptions, stopped: str, evaluator: Evaluator) -> Decision:
    """Keep the search's best or the defaults: rounds side by side (``decide.sequential``) unless
    there is nothing to compare, the defaults failed in the search, or the search was interrupted."""
    defaults = MappingOptions()
    none = decide(())
    if candidate == defaults:
        return replace(none, why="the defaults were the search's best")
    if any(text == defaults.to_json() for text, _ in evaluator.rejected):
        return replace(none, keep=True, why="the defaults failed in the search")
    if stopped == "interrupted":
        return replace(none, why="interrupted before the final rounds, so the defaults stay (resume=True goes on)")
    return sequential(lambda r: evaluator.pair(candidate, defaults, r))


def _viable(space: S.Space, genome: S.Genome) -> bool:
    return S.prune(space, genome) is None


class _Progress:
    """A tqdm bar (terminal or Jupyter), silent without tqdm or when disabled, moved by every
    candidate: over the candidates the search may evaluate, or, with a budget, over its seconds (so
    that the ETA is the budget's). Invalid candidates are counted as the summary counts them
    (pruned ones included); those the budget skipped are counted apart."""

    def __init__(self, generations: int, population: int, deadline: float | None, budget: float | None,
                 enabled: bool) -> None:
        self.bar: Any = None
        self.deadline, self.budget, self.generations = deadline, budget, generations
        self.best, self.invalid, self.skipped, self.gen = math.inf, 0, 0, 1
        candidates = generations * population
        self.shown: Any = None  # in a notebook: the display of the bar's widget, updated when it closes
        if enabled:
            try:
                from tqdm.auto import tqdm

                notebook = sys.modules.get("tqdm.notebook")  # imported by tqdm.auto only inside a notebook
                widget = notebook is not None and issubclass(tqdm, notebook.tqdm)
                kw: dict[str, Any] = {"display": False} if widget else {}
                if budget is not None:
                    self.bar = tqdm(total=round(budget, 1), desc="tuning", unit="s",
                                    bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{remaining} left{postfix}]", **kw)
                else:
                    self.bar = tqdm(total=candidates, desc="tuning", unit="cand", **kw)
                if widget:
                    from IPython.display import display

                    self.shown = display(self.bar.container, display_id=True)
                    self.bar.displayed = True
            except ImportError:
                pass

    def candidate(self, cost: float, how: str) -> None:
        self.best = min(self.best, cost)
        self.invalid += how == "invalid"
        self.skipped += how == "skipped"
        if self.bar is None:
            return
        best = f"{self.best * 1e3:.3f} ms" if math.isfinite(self.best) else "-"
        self.bar.set_postfix(gen=f"{self.gen}/{self.generations}", best=best, invalid=self.invalid,
                             **({"skipped": self.skipped} if self.skipped else {}), refresh=False)
        if self.deadline is not None and self.budget is not None:  # the budget's seconds spent so far
            self.bar.n = round(min(self.budget, max(0.0, self.budget - (self.deadline - time.monotonic()))), 1)
            self.bar.refresh()
        else:
            self.bar.update(1)

    def generation(self, g: Generation) -> None:
        self.gen = min(g.number + 2, self.generations)  # the one evaluated next

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.shown is not None:  # the saved notebook's text form shows the final bar, not the first
            self.shown.update(self.bar.container)
