"""Kernels: ``CheckedDef -> Kernel``, one def callable on arrays (``Kernel x arguments -> arrays``).

A kernel checks its def once, then per call binds the arguments (arity, rank, dtype, sizes),
takes the instance for those shapes from its cache, runs it on the chosen backend and returns
one array or a tuple in declaration order (or fills ``out=``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import deepstack, display, gpurt, interp, layout
from .arguments import (
    array_key,
    c_ready,
    check_backend,
    check_out,
    coerce_any_inputs,
    coerce_inputs,
    default_backend,
    has_cc,
    initial_values,
    layout_key,
    tensor_key,
    torch_args,
)
from .autodiff import attach, backward_of
from .backward import user_backward
from .codegen.gpu import launch_text
from .compiler import CKernel, GpuLowered, Lowered, cpu_target, data_address, lower, lower_gpu, strides_of
from .core import ast as A
from .core import knobs, limits
from .core.checked import CheckedDef
from .core.errors import TcArgumentError, TcError
from .core.instance import Instance, bind_sizes, instantiate
from .core.options import MappingOptions
from .core.retype import retyped
from .core.sema import check_def, check_def_names
from .explain import Explanation
from .explain import explain as explain_lowered
from .grammar import parse
from .polyhedral.cputarget import CpuTarget, preset
from .polyhedral.gpu import SM90
from .polyhedral.treeprint import tree_text
from .training import TrainingTuneResult, autotune_step
from .tuner import tune

# contractions of fewer products keep the def's own layout by default: two transposes, their
# buffers and the general call path cost more than the register tiles gain (an 8x8x8 fully
# connected layer's forward: 19 -> 6 us a call)
LAYOUT_MIN_WORK = 1 << 15
# nor do contractions whose laid-out output rows (the vectors of its register tiles) would be
# shorter than this: their reductions, vectorised as written, do better than mostly masked vectors
LAYOUT_MIN_ROW = 16
_UNSEEN = object()


def _tuned_text(created: float, time_s: float, evaluations: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(created))
    return f"tuned on {when}: {time_s * 1e3:.4g} ms measured, {evaluations} candidates evaluated"


@dataclass(frozen=True)
class OptionsChoice:
    """The mapping options a call with some arguments uses, and where they come from: ``origin``
    is "explicit" (``options=``), "kernel" (``kernel.options`` set), "tuned" (the tuning cache) or
    "defaults"; ``detail`` says it in a line (for a tuned entry: when, and the time measured)."""

    options: MappingOptions
    origin: str
    detail: str

    def header(self) -> str:
        """The line the views print first: where the options come from, and what differs from the defaults."""
        changed = self.options.changes()
        if changed:
            return f"options: {self.detail}; differs from the defaults in {', '.join(changed)}"
        return f"options: {self.detail}" + ("; the search kept the defaults" if self.origin == "tuned" else "")


def user_facing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Errors in the user's TC text or arguments surface at the user's call, without tcdsl's own
    frames (set TCDSL_DEBUG=1 to keep them)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TcError as e:
            if knobs.debug():
                raise
            raise e.with_traceback(None) from None
    return wrapper


def _stack_safe(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A Kernel method that runs on a large-stack thread when the kernel's def nests deeply."""
    @functools.wraps(fn)
    def wrapper(self: Kernel, *args: Any, **kwargs: Any) -> Any:
        if not self._deep:
            return fn(self, *args, **kwargs)
        return deepstack.call(fn, (self, *args), kwargs, what=f"def '{self.name}'",
                              where=self.checked.source.name.span.location())
    return wrapper


def kernels_of(defs: Sequence[A.Def], backend: str | None) -> list[Kernel]:
    """The checked kernels of ``defs`` (deeply nested ones checked on a large-stack thread)."""
    def make(d: A.Def) -> Kernel:
        return Kernel(check_def(d), backend)

    out = []
    for d in defs:
        if deepstack.is_deep(d):
            out.append(deepstack.call(make, (d,), what=f"def '{d.name.name}'", where=d.name.span.location()))
        else:
            out.append(make(d))
    return out


class Kernel:
    """One TC def, callable on arrays; compiled (here: bound) per shape signature and cached."""

    def __init__(self, checked: CheckedDef, backend: str | None = None,
                 options: MappingOptions | None = None) -> None:
        self.checked = checked
        self.name = checked.name
        self.backend = check_backend(backend) if backend else None
        self.options = options or MappingOptions()
        self._plain_options = self.options if self.options == MappingOptions() else None  # _tuned_for's fast path
        self._cache: dict[tuple, Instance] = {}
        self._laid_out: dict[tuple, Instance | None] = {}  # instances of the def rewritten by tcdsl.layout (None: none)
        self._compiled: dict[tuple, CKernel] = {}
        self._by_layout: dict[tuple, CKernel] = {}  # (argument shapes, dtypes and byte strides, options, target)
        self._hot: dict[tuple, tuple] = {}  # see _hot_entry
        # torch tensors' layout -> the arrays' and the kernel's runner on tensors (_hot_tensor_runner)
        self._tensor_layouts: dict[tuple, tuple[tuple, Callable[[Sequence[Any]], Any]]] = {}
        self._gpu: dict[tuple, Any] = {}  # GPU programs per (sizes, backend, options)
        self._tuned: dict[tuple, tuple[MappingOptions, str] | None] = {}  # per argument layout: tuned options, and when
        self.compile_count = 0  # compiled kernels made by this kernel (in-memory cache misses)
        self._lock = threading.Lock()
        self._deep = deepstack.is_deep(checked.source, checked.stmts)
        self._fit: set[int] = set()  # ids of cached instances whose tensors fit in memory
        self.__doc__ = self.__str__()

    @classmethod
    @user_facing
    def of_source(cls, source: str, filename: str = "<string>", backend: str | None = None) -> Kernel:
        """``define(source)`` for a source of one def. The layers below the API (autodiff, the torch
        glue, the tuner's workers) make the kernels of the defs they derive or receive through the
        class of the kernel they were given: they never import the API."""
        module = parse(source, filename)  # define's steps for a source with a def header (the API is above)
        check_def_names(module)
        return kernels_of(module.defs, backend)[0]

    def __repr__(self) -> str:
        return f"<tcdsl kernel {self.name}({', '.join(t.name for t in self.checked.inputs)})>"

    @_stack_safe
    def __str__(self) -> str:
        return str(self.checked)

    @_stack_safe
    def _repr_html_(self) -> str:
        """The def with its inferred ranges, highlighted (Jupyter's rich display)."""
        return display.highlight(str(self.checked))

    @_stack_safe
    def instance(self, *args: Any) -> Instance:
        """The bound instance (concrete sizes, ranges, shapes) for these arguments."""
        arrays = coerce_inputs(self.checked, args)
        return self._instance(arrays)

    def _instance(self, arrays: list[np.ndarray]) -> Instance:
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        inst = self._cache.get(key)
        if inst is None:
            sizes = bind_sizes(self.checked, [a.shape for a in arrays])
            inst = instantiate(self.checked, sizes)
            limits.check_instance(inst)
            with self._lock:
                self._cache[key] = inst
        return inst

    @_stack_safe
    def compiled(self, *args: Any, options: MappingOptions | None = None) -> CKernel:
        """The compiled C kernel for these arguments (built on first use, then cached), with the
        options a call would use (see ``options_for``)."""
        arrays = [c_ready(a) for a in coerce_inputs(self.checked, args)]
        return self._compiled_for(self._instance(arrays), arrays, self._choice(arrays, "c", options).options)

    @functools.cached_property
    def _layout(self) -> bool:
        return layout.applies(self.checked)

    def _for_c(self, inst: Instance, options: MappingOptions) -> Instance:
        """The instance the C backend compiles: the def with its contractions' operands laid out
        (tcdsl.layout) as ``options.layout`` says (by default, unless the options fix tiles or loop
        orders for the def as written, for contractions of LAYOUT_MIN_WORK products or more whose
        laid-out rows are LAYOUT_MIN_ROW long or more)."""
        fixed = options.tile is not None or options.register_tile is not None or options.point_order is not None
        if not self._layout or options.layout is False or (options.layout is None and fixed):
            return inst
        forced = options.layout is True
        key = (tuple(sorted(inst.sizes.items())), forced)
        if key not in self._laid_out:
            least = (0, 0) if forced else (LAYOUT_MIN_WORK, LAYOUT_MIN_ROW)
            rewritten = layout.rewrite(self.checked, inst.sizes, *least)
            with self._lock:
                self._laid_out[key] = None if rewritten is None else instantiate(rewritten, inst.sizes)
        laid = self._laid_out[key]
        return inst if laid is None else laid

    def _compiled_for(self, inst: Instance, arrays: list[np.ndarray], options: MappingOptions) -> CKernel:
        target = cpu_target()
        seen = (layout_key(arrays), options, target)
        ck = self._by_layout.get(seen)  # a repeated call's layout: no instance or stride work
        if ck is not None:
            return ck
        inst = self._for_c(inst, options)
        inputs = {t.name: a for t, a in zip(self.checked.inputs, arrays)}
        strides = strides_of(inst, inputs)
        key = (tuple((a.shape, a.dtype.str) for a in arrays), tuple(sorted(strides.items())), options, target)
        ck = self._compiled.get(key)
        if ck is None:
            ck = CKernel(lower(inst, options, strides, target))
            with self._lock:
                self._compiled[key] = ck
                self.compile_count += 1
        with self._lock:
            self._by_layout[seen] = ck
        return ck

    def _own_options(self) -> bool:
        return self.options is not self._plain_options and self.options != MappingOptions()

    def _tuned_for(self, arrays: list[np.ndarray], backend: str = "c") -> MappingOptions | None:
        """Options a past search stored for these arguments and backend, when the kernel has none
        of its own (a kernel with explicit options ignores the cache)."""
        if self._own_options():
            return None
        found = self._tuned_entry(arrays, backend)
        return found[0] if found is not None else None

    def _tuned_entry(self, arrays: list[np.ndarray], backend: str) -> tuple[MappingOptions, str] | None:
        """(options, how they were found) from the tuning cache, looked up once per argument layout."""
        key = (tuple((a.shape, a.strides, a.dtype) for a in arrays), backend)
        found = self._tuned.get(key, _UNSEEN)
        if found is _UNSEEN:
            found = None
            if knobs.tuning_db().exists():
                try:
                    entry = tune.tuned_entry(self, arrays, backend=backend)
                except TcError:
                    entry = None  # an unreadable cache never stops a call: the defaults run
                if entry is not None:
                    found = (MappingOptions.from_json(entry.options), _tuned_text(entry.created, entry.time_s,
                                                                                 entry.evaluations))
            with self._lock:
                self._tuned[key] = found
        return found  # type: ignore[return-value]

    def _choice(self, arrays: list[np.ndarray], backend: str, options: MappingOptions | None) -> OptionsChoice:
        """The options a call with these arguments on ``backend`` uses, and where they come from."""
        if options is not None:
            return OptionsChoice(options, "explicit", "passed explicitly (options=)")
        if self._own_options():
            return OptionsChoice(self.options, "kernel", "the kernel's own (kernel.options)")
        found = self._tuned_entry(arrays, backend)
        if found is not None:
            return OptionsChoice(found[0], "tuned", found[1])
        return OptionsChoice(self.options, "defaults", "defaults (no tuning cache entry for these arguments)")

    @_stack_safe
    def options_for(self, *args: Any, backend: str = "c") -> MappingOptions:
        """The mapping options a call with these arguments on ``backend`` uses: the kernel's own
        (``kernel.options``) if set, else the tuning cache's for these shapes, dtypes and strides,
        else the defaults. ``explain``, ``source`` and ``schedule`` show them and say which."""
        return self._choice(self._view_arrays(args, backend), check_backend(backend), None).options

    def _view_arrays(self, args: Sequence[Any], backend: str) -> list[np.ndarray]:
        if backend in ("cuda", "opencl"):
            return coerce_any_inputs(self.checked, args)
        return [c_ready(a) for a in coerce_inputs(self.checked, args)]

    @_stack_safe
    def autotune(self, *args: Any, generations: int = 25, population: int = 100, crossover: float = 0.8,
                 mutation: float = 0.07, elites: int = 10, patience: int | None = 5, budget: float | None = None,
                 seed: int | None = None, resume: bool = False, executor: Any = None, cache: Any = None,
                 progress: bool = True, reps: int = 5, run_timeout: float = 60.0, compile_timeout: float = 300.0,
                 runner: str = "tcdsl.tuner.evaluate:time_candidate", backend: str = "c",
                 time_on: str = "local", backward: bool = False,
                 wrt: Sequence[str] | None = None) -> tune.TuneResult | TrainingTuneResult:
        """Search mapping options for these arguments on ``backend`` ("c", "opencl" or "cuda"),
        store the best in the tuning cache and use them for later calls; returns a ``TuneResult``.

        ``backward=True`` tunes a training step instead: the def as a training forward runs it
        (returning the values its backward reads too) and the backward def of ``wrt`` (default:
        every float input; autograd differentiates with respect to the inputs that require
        gradients), whose arguments are made from the forward's results. Each def gets the whole
        ``budget``; autograd's later calls with these shapes use both. Returns a
        ``TrainingTuneResult`` (``.forward``, ``.backward``).

        ``generations``, ``population``, ``crossover``, ``mutation``, ``elites``: the genetic search
        (TC's defaults); ``patience``: stop after this many generations without a better time;
        ``budget``: seconds for the whole search, final check included; ``seed``; ``resume``: go on
        from an interrupted search's checkpoint; ``executor``: a ``concurrent.futures.Executor``
        that compiles candidates (``time_on="executor"``: and times them); ``cache``: a
        ``TuningCache`` (default ``$TCDSL_TUNING_DB``); ``progress``: the progress bar; ``reps``:
        timed runs per candidate; ``run_timeout``/``compile_timeout``: seconds before a candidate
        is scored invalid; ``runner``: the "module:function" that times one candidate."""
        arrays = [c_ready(a) for a in coerce_inputs(self.checked, args)]
        if backward:
            return autotune_step(self, arrays, wrt, generations=generations, population=population,
                                 crossover=crossover, mutation=mutation, elites=elites, patience=patience,
                                 budget=budget, seed=seed, resume=resume, executor=executor, cache=cache,
                                 progress=progress, reps=reps, run_timeout=run_timeout,
                                 compile_timeout=compile_timeout, runner=runner, backend=backend, time_on=time_on)
        result = tune.autotune(self, arrays, generations=generations, population=population, crossover=crossover,
                               mutation=mutation, elites=elites, patience=patience, budget=budget, seed=seed,
                               resume=resume, executor=executor, cache=cache, progress=progress, reps=reps,
                               run_timeout=run_timeout, compile_timeout=compile_timeout, runner=runner,
                               backend=check_backend(backend), time_on=time_on)
        with self._lock:
            self._hot.clear()
            self._tuned[(tuple((a.shape, a.strides, a.dtype) for a in arrays), backend)] = (
                result.options, _tuned_text(time.time(), result.time_s, result.evaluations))
        return result

    @_stack_safe
    def lowered(self, *args: Any, options: MappingOptions | None = None,
                target: CpuTarget | str | None = None) -> Lowered:
        """Every compiler stage for these arguments (no C compiler needed); ``target``: the CPU to
        lower for (a ``CpuTarget``, or a preset's name such as ``"avx2"`` for a cross-build; by
        default the one kernels compile for here)."""
        arrays = [c_ready(a) for a in coerce_inputs(self.checked, args)]
        return self._lowered(arrays, self._choice(arrays, "c", options).options, target)

    def _lowered(self, arrays: list[np.ndarray], opts: MappingOptions, target: CpuTarget | str | None) -> Lowered:
        inst = self._for_c(self._instance(arrays), opts)
        inputs = {t.name: a for t, a in zip(self.checked.inputs, arrays)}
        return lower(inst, opts, strides_of(inst, inputs), preset(target) if isinstance(target, str) else target)

    def double(self) -> Kernel:
        """This def with every ``float``/``half`` tensor and cast made ``double`` (float64), with the
        same backend, options and backward choices: what ``torch.autograd.gradcheck`` checks, since
        float32's rounding swamps its finite differences."""
        wider = {"float32": "float64", "float16": "float64"}
        k = Kernel(check_def(retyped(self.checked.source, wider)), self.backend, self.options)
        save = getattr(self, "_save", None)
        if save is not None:
            attach(k, None, save)
        user = getattr(self, "_user_backward", None)
        if user is not None:
            chosen = check_def(retyped(user[1].checked.source, wider))
            k._user_backward = (user_backward(k.checked, chosen), Kernel(chosen, self.backend))  # type: ignore[attr-defined]
        return k

    @_stack_safe
    def backward_source(self, wrt: Sequence[str] | None = None) -> str:
        """The TC text of the backward def (derived, or the one given to ``define(backward=...)``):
        gradients of ``wrt`` (default: every float input) from the gradients of the outputs."""
        return backward_of(self, wrt).source

    @_stack_safe
    def source(self, *args: Any, backend: str = "c", options: MappingOptions | None = None,
               target: CpuTarget | str | None = None) -> str:
        """The generated code for these arguments' shapes, dtypes and strides: C (for ``target``,
        see ``lowered``), or CUDA / OpenCL (printed on any machine; nothing is compiled), with the
        options a call would use, named in a first comment line (see ``options_for``)."""
        if backend not in ("c", "cuda", "opencl"):
            raise TcArgumentError(f"source() covers the c, cuda and opencl backends; backend {backend!r} has no "
                                  "generated code")
        arrays = self._view_arrays(args, backend)
        choice = self._choice(arrays, backend, options)
        if backend in ("cuda", "opencl"):
            src = lower_gpu(self._instance(arrays), choice.options, backend, SM90).source
            return display.Preformatted(f"/* {choice.header()} */\n{launch_text(src)}\n{src.text}")
        code = self._lowered(arrays, choice.options, target).source.text
        return display.Preformatted(f"/* {choice.header()} */\n{code}")

    @_stack_safe
    def lowered_gpu(self, *args: Any, backend: str = "cuda", options: MappingOptions | None = None,
                    target: Any = None) -> GpuLowered:
        """Every GPU compiler stage for these arguments (no GPU or compiler needed); ``target``: the
        device limits to map for (a ``polyhedral.gpu.GpuTarget``; sm_90 by default)."""
        arrays = coerce_any_inputs(self.checked, args)
        return lower_gpu(self._instance(arrays), self._choice(arrays, backend, options).options, backend,
                         target or SM90)

    def _gpu_for(self, inst: Instance, backend: str, options: MappingOptions) -> Any:
        key = (tuple(sorted(inst.sizes.items())), backend, options)
        gk = self._gpu.get(key)
        if gk is None:
            if backend == "cuda":
                gk = gpurt.CudaKernel(lower_gpu(inst, options, "cuda", gpurt.cuda_target()))
            else:
                gk = gpurt.OpenCLKernel(lower_gpu(inst, options, "opencl"))
            with self._lock:
                self._gpu[key] = gk
                self.compile_count += 1
        return gk

    @_stack_safe
    def schedule(self, *args: Any, options: MappingOptions | None = None) -> str:
        """The schedule tree (after the CPU transformations) as text, after a line naming the
        options a call would use (see ``options_for``)."""
        arrays = self._view_arrays(args, "c")
        choice = self._choice(arrays, "c", options)
        tree = tree_text(self._lowered(arrays, choice.options, None).final)
        return display.ScheduleTree(f"# {choice.header()}\n{tree}")

    @_stack_safe
    def explain(self, *args: Any, options: MappingOptions | None = None) -> Explanation:
        """Why each loop is or is not parallel, and which statements were fused, with the options a
        call would use (see ``options_for``) and where they come from."""
        arrays = self._view_arrays(args, "c")
        choice = self._choice(arrays, "c", options)
        low = self._lowered(arrays, choice.options, None)
        text = explain_lowered(low, low.options)
        return Explanation(f"{choice.header()}\n{text}", text.rows)

    def _hot_kernel(self, args: Sequence[Any]) -> CKernel | None:
        """The C kernel a plain call (no ``out``, ``backend`` or ``options``) on numpy arrays with
        these shapes, dtypes and strides ran last, when nothing it was chosen by has changed since:
        the kernel's options and backend, the tuning done in this process, ``$TCDSL_CPU`` and ``$CC``."""
        hit = self._hot_entry(args)
        return hit[0] if hit is not None else None

    def _hot_entry(self, args: Sequence[Any]) -> tuple | None:
        """``_hot_kernel``'s entry: (kernel, options, backend, environment, its direct runner)."""
        key = array_key(args)
        return None if key is None else self._hot_hit(key)

    def _hot_into(self, args: Sequence[Any], out: Any) -> Any:
        """A repeated call with ``out=`` on numpy arrays: straight to the kernel the same call ran
        before (``CKernel.direct_into``), where the caller's arrays can take the results (writeable,
        aligned, sharing no memory with an input); the call's result, else None."""
        outs = out if type(out) is tuple or type(out) is list else (out,)
        key = array_key((*args, *outs))
        hit = None if key is None else self._hot_hit(("out=", len(args)) + key)
        if hit is None:
            return None
        for o in outs:
            flags = o.flags
            if not (flags.writeable and flags.aligned) or any(np.may_share_memory(o, a) for a in args):
                return None
        hit[4](args, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _hot_tensor_runner(self, tensors: Sequence[Any]) -> Callable[[Sequence[Any]], Any] | None:
        """For CPU torch tensors, by their shapes, dtypes and strides (no numpy view made): the
        runner on tensors of the kernel that the same call on their numpy views would run, as
        ``_hot_kernel`` finds it (``_note_tensor_layout``)."""
        return self._tensor_runner(tensor_key(tensors))

    def _tensor_runner(self, layout: tuple) -> Callable[[Sequence[Any]], Any] | None:
        """``_hot_tensor_runner`` by the tensors' layout key (``tensor_key``)."""
        got = self._tensor_layouts.get(layout)
        if got is None:
            return None
        hit = self._hot.get(got[0])  # (_hot_hit, inline: a repeated call's path)
        if hit is None or hit[1] is not self.options or hit[2] != self.backend or hit[3] != _call_env():
            return None
        return got[1]

    def _hot_hit(self, layout: tuple) -> tuple | None:
        hit = self._hot.get(layout)
        if hit is None or hit[1] is not self.options or hit[2] != self.backend or hit[3] != _call_env():
            return None
        return hit

    def _note_tensor_layout(self, tensors: Sequence[Any], arrays: Sequence[np.ndarray],
                            direct: Callable[[CKernel], Callable[[Sequence[Any]], Any]]) -> None:
        """Remember that ``tensors`` have the layout of their numpy views ``arrays``, and how the
        kernel those ran runs on the tensors themselves (``direct`` of it)."""
        key = layout_key(arrays)
        hit = self._hot.get(key)
        if hit is not None and hit[0].plain:
            self._tensor_layouts[tensor_key(tensors)] = (key, direct(hit[0]))

    def __call__(self, *args: Any, out: Any = None, backend: str | None = None,
                 options: MappingOptions | None = None) -> Any:
        try:  # errors surface here, as user_facing says: a repeated call's path has no wrapper
            if backend == "c" and options is None and (self.backend == "c" or (self.backend is None and has_cc())) \
                    and all(type(a) is np.ndarray for a in args):
                backend = None  # the backend this call takes anyway: the repeated-call paths below serve it
            if out is None and backend is None and options is None and not self._deep:
                key = []  # a repeated call on arrays: straight to its kernel (_hot_entry, inline)
                for a in args:
                    if type(a) is not np.ndarray:
                        break
                    key.append((a.shape, a.dtype, a.strides))
                else:
                    hit = self._hot.get(tuple(key))
                    if hit is not None and hit[1] is self.options and hit[2] == self.backend \
                            and hit[3] == _call_env():
                        return hit[4](args)
                if _TORCH_OPS is not None:  # tensors: torch_ops' repeated-call path
                    fast = _TORCH_OPS.repeated(self, args)
                    if fast is not None:
                        return fast
            elif backend is None and options is None and not self._deep:
                into = self._hot_into(args, out)
                if into is None and _TORCH_OPS is not None:  # tensors: torch_ops' repeated out= path
                    into = _TORCH_OPS.repeated_into(self, args, out)
                if into is not None:
                    return into
            return self._call(*args, out=out, backend=backend, options=options)
        except TcError as e:
            if knobs.debug():
                raise
            raise e.with_traceback(None) from None

    @_stack_safe
    def _call(self, *args: Any, out: Any = None, backend: str | None = None,
              options: MappingOptions | None = None) -> Any:
        if self._deep and out is None and backend is None and options is None:  # (__call__ tried the rest)
            hit = self._hot_entry(args)
            if hit is not None:
                return hit[4](args)
        if torch_args(args):  # torch tensors, CPU or CUDA: tcdsl.torch_ops (autograd)
            return load_torch_ops().call(self, args, out=out, backend=backend, options=options)
        on_device = any(gpurt.is_device_array(a) for a in args)
        be = check_backend(backend or self.backend or ("cuda" if on_device else default_backend()))
        if be == "cuda" or on_device:
            if be != "cuda":
                raise TcArgumentError(f"{self.name}(): the arguments are on a CUDA device; backend {be!r} runs on "
                                      "the host (pass host arrays, or backend='cuda')")
            arrays = coerce_any_inputs(self.checked, args)
            inst = self._instance(arrays)
            outs = check_out(self.checked, inst, out, device=on_device)
            tuned = None if on_device else self._tuned_for(arrays, "cuda")
            gk = self._gpu_for(inst, "cuda", options or tuned or self.options)
            res = gk({t.name: a for t, a in zip(self.checked.inputs, arrays)}, initial_values(self.checked, outs))
            values = [res[t.name] if on_device else res[t.name].get() for t in self.checked.outputs]
            if outs is not None:
                for dst, v in zip(outs, values):
                    if gpurt.is_device_array(dst):
                        dst[...] = v
                    else:
                        np.copyto(dst, v if isinstance(v, np.ndarray) else v.get())
                values = list(outs)
            return values[0] if len(values) == 1 else tuple(values)
        arrays = coerce_inputs(self.checked, args)
        inst = self._instance(arrays)
        outs = check_out(self.checked, inst, out)
        initial = initial_values(self.checked, outs)
        if id(inst) not in self._fit:  # instances stay cached, so their ids stay theirs
            limits.check_memory(inst)
            self._fit.add(id(inst))
        if be == "opencl":
            gk = self._gpu_for(inst, "opencl", options or self._tuned_for(arrays, "opencl") or self.options)
            results = gk({t.name: a for t, a in zip(self.checked.inputs, arrays)}, initial)
        elif be == "c":
            arrays = [c_ready(a) for a in arrays]
            ck = self._compiled_for(inst, arrays, options or self._tuned_for(arrays) or self.options)
            inputs = {t.name: a for t, a in zip(self.checked.inputs, arrays)}
            if outs is not None and ck.writes_in_place(inputs, outs):
                ck(inputs, outs)
                if backend is None and options is None and ck.plain and all(a is x for a, x in zip(arrays, args)):
                    with self._lock:  # the next such call goes straight to the kernel (_hot_into)
                        self._hot[("out=", len(args)) + layout_key([*arrays, *outs])] = (
                            ck, self.options, self.backend, _call_env(), ck.direct_into())
                return outs[0] if len(outs) == 1 else tuple(outs)
            results = ck(inputs, initial=initial)
            if out is None and backend is None and options is None and all(a is x for a, x in zip(arrays, args)):
                with self._lock:  # the next such call goes straight to the kernel (_hot_kernel)
                    run = ck.direct(data_address) if ck.plain else _runner(ck)
                    self._hot[layout_key(arrays)] = (ck, self.options, self.backend, _call_env(), run)
        else:
            results = interp.run(inst, {t.name: a for t, a in zip(self.checked.inputs, arrays)}, initial)
        values = [results[t.name] for t in self.checked.outputs]
        if outs is not None:
            for dst, v in zip(outs, values):
                np.copyto(dst, v)
            values = list(outs)
        return values[0] if len(values) == 1 else tuple(values)


def load_torch_ops() -> Any:
    """tcdsl.torch_ops, which imports torch (optional): loaded by the first call with tensors."""
    global _TORCH_OPS
    if _TORCH_OPS is None:
        from . import torch_ops

        _TORCH_OPS = torch_ops
    return _TORCH_OPS


def torch_ops_if_loaded() -> Any:
    """tcdsl.torch_ops once a call with tensors loaded it, else None (the repeated-call paths' test)."""
    return _TORCH_OPS


_TORCH_OPS: Any = None


_call_env = knobs.call_env  # what a repeated call checks in the environment before it reuses its kernel


def _runner(ck: CKernel) -> Callable[[Sequence[np.ndarray]], Any]:
    """A repeated call's run of a kernel with an empty tensor (not ``plain``): ``CKernel.run``."""
    def run(arrays: Sequence[np.ndarray]) -> Any:
        made = ck.run(arrays)
        return made[0] if len(made) == 1 else tuple(made)
    return run
