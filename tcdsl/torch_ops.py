"""PyTorch glue: kernel calls on torch tensors (``Kernel x torch.Tensor``s -> ``torch.Tensor``s), through
the custom ops ``tcdsl::forward`` / ``tcdsl::backward`` whose autograd runs backward defs, and
``tcdsl::update`` for calls with ``out=``.
"""

# Both ops have fake implementations, so they trace under torch.compile. CPU tensors are shared
# with the kernel through numpy views (no copies); outputs are allocated by torch.

from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import increment_version

from . import gpurt
from .autodiff import attach, backward_of
from .backward import Backward, saved_types
from .core import dtypes as T
from .core.batching import batched
from .core.errors import TcArgumentError, TcWarning
from .core.instance import accumulate_error, bind_sizes, instantiate
from .core.options import MappingOptions
from .core.printer import definition
from .core.sema import check_def
from .grammar import parse

_TORCH_DTYPES = {
    "bool": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
    "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
}


def torch_dtype(tc_type: str) -> torch.dtype:
    return _TORCH_DTYPES[T.canonical(tc_type)]


@dataclass
class _Entry:
    """What a ``tcdsl::forward`` or ``tcdsl::backward`` key stands for."""

    kernel: Any  # the tcdsl.kernel.Kernel called (the forward with saved temporaries, for training)
    backend: str | None
    options: Any
    owner: Any  # the user's kernel (its backward defs)
    outputs: tuple[tuple[str, str], ...]  # (name, TC type) of each tensor the op returns
    n_user_outputs: int  # the first n are the kernel's outputs, the others values saved for backward
    backward: Backward | None = None


_REGISTRY: dict[str, _Entry] = {}
_LOCK = threading.Lock()
KERNEL_OF_SOURCE: Any = None  # tcdsl.kernel.Kernel.of_source, set by the package: rebuilds a key's kernel
KEY_VERSION = 1


def _register(entry: _Entry, base: str) -> str:
    """A key of this process only (a def with a backward given as a kernel: no text rebuilds it)."""
    with _LOCK:
        key = f"{base}#{len(_REGISTRY)}"
        _REGISTRY[key] = entry
    return key


def _stable_key(kernel: Any, backend: str | None, options: Any, train: bool) -> str:
    """A key that names the kernel by its def's text, the backend, the options and whether it
    trains: the same in every process, and enough to rebuild the entry (``_entry``), so that a
    graph exported with the op (``torch.export``) runs in another process after ``import tcdsl``."""
    save = getattr(kernel, "_save", None)
    return json.dumps({"tcdsl": KEY_VERSION, "def": definition(kernel.checked.source), "backend": backend,
                       "options": options.to_json() if options is not None else None,
                       "kernel_backend": kernel.backend, "kernel_options": kernel.options.to_json(),
                       "save": dict(save) if isinstance(save, dict) else list(save) if save is not None else None,
                       "train": train}, sort_keys=True)


def _entry(key: str) -> _Entry:
    """The entry of ``key``: registered in this process, or rebuilt from a stable key's text."""
    e = _REGISTRY.get(key)
    if e is not None:
        return e
    try:
        spec = json.loads(key)
        ok = isinstance(spec, dict) and spec.get("tcdsl") == KEY_VERSION and KERNEL_OF_SOURCE is not None
    except ValueError:
        ok = False
    if not ok:
        raise TcArgumentError(f"no tcdsl kernel is registered under {key!r} in this process; a graph that "
                              "holds it was saved from another process (keys of defs with a backward given as "
                              "a kernel do not travel)")
    kernel = KERNEL_OF_SOURCE(spec["def"], backend=spec["kernel_backend"])
    kernel.options = MappingOptions.from_json(spec["kernel_options"])
    if spec["save"] is not None:
        attach(kernel, None, spec["save"])
    options = MappingOptions.from_json(spec["options"]) if spec["options"] is not None else None
    _forward_key(kernel, spec["backend"], options, spec["train"])
    return _REGISTRY[key]


@torch.compiler.assume_constant_result  # under torch.compile: run once while tracing, a constant after
def _forward_key(kernel: Any, backend: str | None, options: Any, train: bool) -> str:
    keys: dict = kernel.__dict__.setdefault("_torch_keys", {})
    k = (backend, options, train)
    key = keys.get(k)
    if key is None:
        c = kernel.checked
        outs = tuple((t.name, t.dtype) for t in c.outputs)
        run = kernel
        if train and getattr(kernel, "_user_backward", None) is None:
            bw = backward_of(kernel)
            if bw.forward_source is not None:  # a kernel of the same class (this module never imports the API)
                run = type(kernel)(check_def(parse(bw.forward_source).defs[0]), kernel.backend, kernel.options)
                run._save = ()  # type: ignore[attr-defined]  # its backward reads the saved values as outputs
                types = saved_types(bw, c)
                outs += tuple((n, types[n]) for n in bw.saved)
        entry = _Entry(run, backend, options, kernel, outs, len(c.outputs))
        if getattr(kernel, "_user_backward", None) is None:
            key = _stable_key(kernel, backend, options, train)
            with _LOCK:  # another kernel of the same text and choices may hold it: the same computation
                _REGISTRY[key] = entry
        else:
            key = _register(entry, c.name)
        keys[k] = key
    return key


# ---- the custom ops -----------------------------------------------------------------------------


@torch.library.custom_op("tcdsl::forward", mutates_args=())
def _forward(key: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    e = _entry(key)
    return _run(e, args)


@_forward.register_fake
def _forward_fake(key: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    e = _entry(key)
    shapes = _output_shapes(e, args)
    return [args[0].new_empty(shapes[n], dtype=torch_dtype(t)) for n, t in e.outputs] if args else \
        [torch.empty(shapes[n], dtype=torch_dtype(t)) for n, t in e.outputs]


@torch.library.custom_op("tcdsl::backward", mutates_args=())
def _backward(key: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    return _run(_REGISTRY[key], args)


@_backward.register_fake
def _backward_fake(key: str, args: list[torch.Tensor]) -> list[torch.Tensor]:
    e = _REGISTRY[key]
    assert e.backward is not None
    inputs = {p.of: a for p, a in zip(e.backward.params, args) if p.role == "input"}
    return [inputs[w].new_empty(inputs[w].shape, dtype=inputs[w].dtype) for w in e.backward.grads]


_BATCHED: dict[tuple[str, tuple[str, ...], bool], tuple[str, frozenset[str]]] = {}


def _batched_key(key: str, names: tuple[str, ...], train: bool) -> tuple[str, frozenset[str]]:
    """The forward key of the def of ``key``'s kernel over a leading batch of the inputs ``names``,
    and the tensors that carry the batch (``core.batching``)."""
    k = (key, names, train)
    found = _BATCHED.get(k)
    if found is None:
        e = _entry(key)
        d, carry = batched(e.kernel.checked.source, names)
        kernel = KERNEL_OF_SOURCE(definition(d), backend=e.kernel.backend)
        # options are per loop of the def they were made for: the batched def takes its own defaults
        found = _BATCHED[k] = (_forward_key(kernel, e.backend, None, train), carry)
    return found


def _vmap(info: Any, in_dims: tuple[Any, ...], key: str, args: list[torch.Tensor]) -> tuple[list, list]:
    """``torch.vmap`` of an op: one kernel of the def batched over a leading index (not a loop of
    calls); outputs that depend on no batched input come back unbatched."""
    dims = list(in_dims[1])
    e = _entry(key)
    names = tuple(t.name for t, d in zip(e.kernel.checked.inputs, dims) if d is not None)
    moved = [a.movedim(d, 0) if d is not None else a for a, d in zip(args, dims)]
    train = torch.is_grad_enabled() and any(a.requires_grad for a in moved)
    bkey, carry = _batched_key(key, names, train)
    outs = _forward(bkey, moved)[:len(e.outputs)]
    return outs, [0 if n in carry else None for n, _ in e.outputs]


torch.library.register_vmap(_forward, _vmap)
torch.library.register_vmap(_backward, _vmap)


def _wrt(kernel: Any, needs: list[bool]) -> list[str]:
    return [t.name for t, need in zip(kernel.checked.inputs, needs) if need and T.is_float(t.dtype)]


_KEPT: dict[tuple[str, tuple[bool, ...]], tuple[list[str], list[bool]]] = {}  # (key, needs) -> what _setup keeps


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """Keep for the backward only the tensors its def reads (also under double backward), and in
    ``ctx.tc`` what ``_autograd`` needs: the key, which inputs need a gradient, the outputs' shapes
    and dtypes, and the names of the kept tensors."""
    key, args = inputs
    needs = tuple([a.requires_grad for a in args])
    ctx.set_materialize_grads(False)  # saved values get a gradient only under double backward
    plan = _KEPT.get((key, needs))
    if plan is None:
        e = _entry(key)
        wrt = _wrt(e.owner, list(needs))
        keep: set[str] = set()
        for owner in dict.fromkeys([e.owner, e.kernel]) if wrt else ():
            keep |= {p.name if p.role == "saved" else p.of for p in backward_of(owner, wrt).params if p.role != "grad"}
        names = [t.name for t in e.owner.checked.inputs] + [n for n, _ in e.outputs]
        plan = _KEPT[(key, needs)] = ([n for n in names if n in keep], [n in keep for n in names])
    ctx.tc = (key, needs, [(o.shape, o.dtype) for o in output], plan[0])
    ctx.save_for_backward(*[t for t, kept in zip((*args, *output), plan[1]) if kept])


_PLANS: dict[tuple[str, tuple[bool, ...], bool], tuple[str, list[tuple[bool, str]], list[int]] | None] = {}


def _autograd(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[None, list[torch.Tensor | None]]:
    key, needs, out_meta, kept = ctx.tc
    e = _entry(key)
    # the kernel's backward; when the values it saved have gradients too (double backward), the
    # backward of the def that returns them, which counts them as outputs
    double = any(g is not None for g in grads[e.n_user_outputs:])
    plan_key = (key, needs, double)
    if plan_key in _PLANS:
        plan = _PLANS[plan_key]
    else:
        plan = _PLANS[plan_key] = _backward_plan(e, e.kernel if double else e.owner, list(needs))
    result: list[torch.Tensor | None] = [None] * len(needs)
    if plan is None:
        return None, result
    bkey, sources, positions = plan
    values = dict(zip(kept, ctx.saved_tensors))
    grads_of = {n: (g, meta) for (n, _), g, meta in zip(e.outputs, grads, out_meta)}
    bargs = []
    for is_grad, name in sources:
        if is_grad:
            g, (shape, dtype) = grads_of[name]
            bargs.append(torch.zeros(shape, dtype=dtype) if g is None else g.contiguous())
        else:
            bargs.append(values[name])
    # a first backward of plain tensors runs the backward def directly; under double backward
    # (grad mode on) or tracing, through its op, which is differentiable in turn
    direct = not torch.is_grad_enabled() and _eager(bargs)
    got = _run(_REGISTRY[bkey], bargs) if direct else _backward(bkey, bargs)
    for i, g in zip(positions, got):
        if i >= 0:
            result[i] = g
    return None, result


def _backward_plan(e: _Entry, owner: Any, needs: list[bool]) -> tuple[str, list[tuple[bool, str]], list[int]] | None:
    """What ``_autograd`` does for these inputs' needs (None: no gradient to compute): the backward
    op's key, where each of its params comes from (a gradient of an output, else a kept value by
    name), and the input position of each gradient it returns (-1: not needed)."""
    wrt = _wrt(owner, needs)
    if not wrt:
        return None
    bw = backward_of(owner, wrt)
    names = [t.name for t in owner.checked.inputs]
    sources = [(p.role == "grad", p.of if p.role in ("grad", "input", "output") else p.name) for p in bw.params]
    positions = [names.index(w) if needs[names.index(w)] else -1 for w in bw.grads]
    return _backward_key(owner, e, bw), sources, positions


_forward.register_autograd(_autograd, setup_context=_setup)
_backward.register_autograd(_autograd, setup_context=_setup)  # a backward def is a def: double backward


def _backward_key(owner: Any, e: _Entry, bw: Backward) -> str:
    keys: dict = owner.__dict__.setdefault("_torch_backward_keys", {})
    k = (bw.name, bw.grads, e.backend, e.options, bw.user)
    key = keys.get(k)
    if key is None:
        if bw.user:
            kernel = owner._user_backward[1]
        else:
            kernel = type(owner).of_source(bw.source, filename=f"<backward of {owner.name}>", backend=owner.backend)
        kernel._save = ()  # its own backward (double backward) recomputes: the op returns only gradients
        outs = tuple((t.name, t.dtype) for t in kernel.checked.outputs)
        key = keys[k] = _register(_Entry(kernel, e.backend, e.options, kernel, outs, len(outs), bw), bw.name)
    return key


# ---- running a kernel on tensors ----------------------------------------------------------------


def _output_shapes(e: _Entry, args: list[torch.Tensor]) -> dict[str, tuple[int, ...]]:
    c = e.kernel.checked
    shapes = [tuple(int(n) for n in a.shape) for a in args]
    cache: dict = e.kernel.__dict__.setdefault("_torch_shapes", {})
    got = cache.get(tuple(shapes))
    if got is None:
        inst = instantiate(c, bind_sizes(c, shapes))
        got = cache[tuple(shapes)] = dict(inst.shapes)
    return got  # type: ignore[no-any-return]


def _run_cpu(e: _Entry, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``_run`` on CPU tensors, at their addresses where the same layout ran before."""
    if e.backend is None and e.options is None:
        run = e.kernel._hot_tensor_runner(args)
        if run is not None:
            res = run(args)
            return list(res) if type(res) is tuple else [res]
    return _run(e, list(args))


def _direct(kernel: Any) -> Any:
    """A compiled kernel's repeated-call runner on CPU tensors: at their addresses, into fresh tensors."""
    return kernel.direct(torch.Tensor.data_ptr, torch.from_numpy)


def _run(e: _Entry, args: list[torch.Tensor]) -> list[torch.Tensor]:
    if any(a.is_cuda for a in args):
        return _run_cuda(e, args)
    repeated = e.backend is None and e.options is None  # the kernel's repeated-call path; fresh arrays become tensors
    if repeated:
        run = e.kernel._hot_tensor_runner(args)
        if run is not None:  # no numpy views: the tensors' addresses
            res = run(args)
            return list(res) if type(res) is tuple else [res]
    arrays = [a.detach().numpy() if a.requires_grad else a.numpy() for a in args]
    if repeated:
        hot = e.kernel._hot_kernel(arrays)
        res = hot.run(arrays) if hot is not None else e.kernel(*arrays)
        e.kernel._note_tensor_layout(args, arrays, _direct)
        return [torch.from_numpy(r) if r.flags.writeable else torch.tensor(r)
                for r in (res if isinstance(res, (tuple, list)) else (res,))]
    shapes = _output_shapes(e, args)
    outs = [torch.empty(shapes[n], dtype=torch_dtype(t)) for n, t in e.outputs]
    views = [o.numpy() for o in outs]
    e.kernel(*arrays, out=views if len(views) > 1 else views[0], backend=e.backend, options=e.options)
    return outs


def _run_cuda(e: _Entry, args: list[torch.Tensor]) -> list[torch.Tensor]:
    """The entry's kernel on CUDA tensors: shared with cupy through DLPack (no copies), run on the
    CUDA backend, outputs handed back to torch on the same device."""
    cp = gpurt._cupy()
    arrays = [cp.from_dlpack(a.detach().contiguous()) for a in args]
    res = e.kernel(*arrays, backend=e.backend or "cuda", options=e.options)
    return [torch.from_dlpack(r) for r in (res if isinstance(res, tuple) else (res,))]


def _tensors(kernel: Any, args: tuple[Any, ...]) -> list[torch.Tensor]:
    c = kernel.checked
    if len(args) != len(c.inputs):
        raise TcArgumentError(f"{c.name}() takes {len(c.inputs)} arguments ({', '.join(t.name for t in c.inputs)}), "
                              f"got {len(args)}", c.source.name.span.location())
    out = []
    for t, a in zip(c.inputs, args):
        want = torch_dtype(t.dtype)
        if not isinstance(a, torch.Tensor):
            if t.dims or not isinstance(a, (bool, int, float, np.generic)):
                raise TcArgumentError(f"'{t.name}' is a {type(a).__name__} among torch tensors; pass a tensor",
                                      t.span.location())
            a = torch.tensor(a, dtype=want)
        if a.dtype != want:
            hint = (f" (convert it with .to(torch.{t.dtype}), or call {c.name}.double(), the def in float64)"
                    if a.dtype == torch.float64 and want in (torch.float32, torch.float16) else "")
            raise TcArgumentError(f"'{t.name}' is declared {t.dtype} but the tensor has dtype {a.dtype}{hint}",
                                  t.span.location())
        if a.device.type not in ("cpu", "cuda"):
            raise TcArgumentError(f"'{t.name}' is on {a.device}; tcdsl runs torch tensors on the CPU (backends "
                                  f"'c' and 'numpy') or on CUDA devices (backend 'cuda'); move it with .cpu()",
                                  t.span.location())
        if a.layout is not torch.strided:
            raise TcArgumentError(f"'{t.name}' is a {str(a.layout).removeprefix('torch.')} tensor; tcdsl reads "
                                  "strided (dense) tensors: convert it with .to_dense()", t.span.location())
        out.append(a)
    if len({a.device for a in out if a.dim() or a.is_cuda}) > 1:
        raise TcArgumentError(f"{c.name}(): the tensors are on different devices "
                              f"({', '.join(sorted({str(a.device) for a in out}))})", c.source.name.span.location())
    return out


def call(kernel: Any, args: tuple[Any, ...], out: Any = None, backend: str | None = None, options: Any = None) -> Any:
    """``kernel(*args)`` on torch tensors: tensors out, differentiable where an input requires grad
    (CUDA tensors run on the CUDA backend, forward and backward defs alike)."""
    if out is None and backend is None and options is None:
        fast = repeated(kernel, args)
        if fast is not None:
            return fast
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    grads = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    if cuda and (out is not None or not grads):
        return gpurt.torch_cuda_call(kernel, args, out=out, backend=backend, options=options)
    if out is None and kernel.checked.accumulates:
        raise accumulate_error(kernel.checked)
    tensors = _tensors(kernel, args)
    if out is not None:
        return _call_out(kernel, tensors, out, backend, options)
    train = torch.is_grad_enabled() and any(a.requires_grad for a in tensors)
    if (train and "_gradcheck_told" not in kernel.__dict__ and not torch.compiler.is_compiling()
            and _narrow_gradients(tensors) and _under_gradcheck()):
        kernel._gradcheck_told = True
        warnings.warn(f"gradcheck of def '{kernel.name}' in {_narrow_gradients(tensors)}: its rounding swamps the "
                      f"finite differences, so the check fails on correct gradients; check {kernel.name}.double() "
                      "(the def in float64) on float64 tensors instead", TcWarning, stacklevel=_outside_tcdsl())
    key = _forward_key(kernel, backend, options, train)
    n = len(kernel.checked.outputs)
    if not _eager(tensors):
        res = _forward(key, tensors)[:n]
    elif train:
        res = list(_EagerStep.apply(key, None, *tensors)[:n])
    else:
        res = _run(_entry(key), tensors)[:n]
    return res[0] if n == 1 else tuple(res)


def repeated(kernel: Any, args: tuple[Any, ...]) -> Any:
    """``call``'s result for plain CPU tensors of the def's dtypes in eager mode, with no checks
    left to make (None otherwise): a repeated call's path, a few microseconds of Python besides
    the kernel's own (``Kernel.__call__`` tries it first, once this module is loaded). A training
    call on a layout that trained before runs from its plan (``_Step``, ``_LeanStep``)."""
    needs = []
    layout = []  # Kernel._tensor_layouts' key, built on the way
    for a in args:
        if type(a) not in _PLAIN or not a.is_cpu or a.layout is not _STRIDED:
            return None
        needs.append(a.requires_grad)
        layout.append((a.shape, a.dtype, a.stride()))
    train = True in needs
    if torch.compiler.is_compiling() or kernel.checked.accumulates:
        return None
    if torch._C._functorch.peek_interpreter_stack() is not None and _functorch_wrapped(args):
        return None  # (no functorch transform running: no wrapped tensor to look for)
    train = train and torch.is_grad_enabled()
    lay = tuple(layout)
    if not train:  # a layout that ran before: straight to its kernel
        run = kernel._tensor_runner(lay)
        if run is not None:
            return run(args)
    else:
        if "_gradcheck_told" not in kernel.__dict__ and _probe(kernel) and _narrow_gradients(list(args)) \
                and _under_gradcheck():
            return None  # the slow path warns
        steps = kernel.__dict__.get("_train_steps")  # a layout that trained before: its plan (dtypes checked then)
        step = steps.get((lay, tuple(needs))) if steps is not None else None
        if step is not None and step.fk._tensor_runner(lay) is step.run:
            res = _LeanStep.apply(step, *args)
            return res[0] if step.n_user == 1 else res[:step.n_user]
    dtypes = kernel.__dict__.get("_torch_dtypes")
    if dtypes is None:
        dtypes = kernel._torch_dtypes = tuple(torch_dtype(t.dtype) for t in kernel.checked.inputs)
    if len(args) != len(dtypes) or any(a.dtype != want for a, want in zip(args, dtypes)):
        return None
    n = len(kernel.checked.outputs)
    if not train:
        res = _run_cpu(_entry(_forward_key(kernel, None, None, False)), args)
        return res[0] if n == 1 else tuple(res[:n])
    # the forward def's kernel for this layout, when it ran before (the def itself, or the one that saves)
    key = _forward_key(kernel, None, None, True)
    e = _entry(key)
    res = _EagerStep.apply(key, e.kernel._tensor_runner(lay), *args)
    _remember_step(kernel, key, e, lay, tuple(needs), res)
    return res[0] if n == 1 else tuple(res[:n])


def repeated_into(kernel: Any, args: tuple[Any, ...], out: Any) -> Any:
    """``call``'s result with ``out=`` for plain CPU tensors in eager mode, none of them needing a
    gradient, where the kernel ran on this layout before (None otherwise): the numpy views'
    repeated ``out=`` path, and the mutation told to autograd."""
    outs = out if type(out) is tuple or type(out) is list else (out,)
    for a in (*args, *outs):
        if type(a) not in _PLAIN or not a.is_cpu or a.layout is not _STRIDED or a.requires_grad:
            return None
    if torch.compiler.is_compiling() or (torch._C._functorch.peek_interpreter_stack() is not None
                                         and _functorch_wrapped((*args, *outs))):
        return None
    views = [o.numpy() for o in outs]
    if kernel._hot_into([a.numpy() for a in args], views if len(views) > 1 else views[0]) is None:
        return None
    increment_version(outs)
    return out


def _eager(tensors: Sequence[Any]) -> bool:
    """Plain CPU tensors outside any tracing (no ``torch.compile``, export, fake or functorch
    tensor): the op's dispatch, some tens of microseconds a call, is skipped, and autograd gets the
    same forward and backward through ``_EagerStep``."""
    return (all(type(a) in _PLAIN and a.is_cpu for a in tensors) and not torch.compiler.is_compiling()
            and (torch._C._functorch.peek_interpreter_stack() is None  # no transform running: nothing wrapped
                 or not _functorch_wrapped(tuple(tensors))))


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided


class _EagerStep(torch.autograd.Function):
    """The forward op and its autograd (``_setup``, ``_autograd``) as a plain autograd function,
    for eager calls."""

    @staticmethod
    def forward(ctx: Any, key: str, run: Any, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        """``run``: the kernel's runner on these tensors' layout where it ran before (else None)."""
        if run is None:
            outs = _run(_entry(key), list(args))
        else:
            res = run(args)
            outs = list(res) if type(res) is tuple else [res]
        _setup(ctx, (key, args), outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        return (None, None, *_autograd(ctx, list(grads))[1])


class _Step:
    """A repeated training call's plan for one layout of a kernel's tensors (shapes, dtypes,
    strides, and which need a gradient): what ``_setup`` and ``_autograd`` look up on each call,
    looked up once. ``run`` is the forward kernel's runner for the layout, valid while
    ``fk._tensor_runner`` still gives it (the same options, backend and call environment). The
    backward's part (``bw``) is filled in by the first backward that ran its kernel directly:
    the backward kernel, its runner and layout key, where each of its arguments comes from (an
    index among the saved tensors, or ``-1 - j`` for the j-th of the output gradients it reads),
    those gradients' output numbers and the layouts they must have, and the input position of
    each gradient it returns (-1: not needed)."""

    __slots__ = ("fk", "run", "tc", "keep", "n_user", "bw")

    def __init__(self, fk: Any, run: Any, tc: tuple, keep: list[bool], n_user: int) -> None:
        self.fk, self.run, self.tc, self.keep, self.n_user = fk, run, tc, keep, n_user  # n_user: the def's outputs
        self.bw: tuple | None = None


_STEPS_PER_KERNEL = 64  # layouts whose training plan a kernel keeps (then it starts over)


def _remember_step(kernel: Any, key: str, e: _Entry, lay: tuple, needs: tuple[bool, ...], res: Any) -> None:
    """After ``_EagerStep`` ran ``kernel`` on tensors of layout ``lay``: its ``_Step``, where the
    forward's runner for the layout and the saved-tensor plan (``_setup``'s) exist."""
    run = e.kernel._tensor_runner(lay)
    kept = _KEPT.get((key, needs))
    if run is None or kept is None:
        return
    outs = res if type(res) is tuple else (res,)
    steps = kernel.__dict__.setdefault("_train_steps", {})
    if len(steps) >= _STEPS_PER_KERNEL:
        steps.clear()
    steps[(lay, needs)] = _Step(e.kernel, run, (key, needs, [(o.shape, o.dtype) for o in outs], kept[0]),
                                kept[1], e.n_user_outputs)


class _LeanStep(torch.autograd.Function):
    """``_EagerStep`` with its plan (``_Step``) made: the same forward, saved tensors and
    gradients, without the lookups. A backward it cannot take directly (a gradient missing or of
    another layout, double backward, grad mode on, a transform or trace running) goes the
    general way, ``_autograd``."""

    @staticmethod
    def forward(ctx: Any, step: _Step, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        res = step.run(args)
        outs = res if type(res) is tuple else (res,)
        ctx.set_materialize_grads(False)
        ctx.tc, ctx.step = step.tc, step
        ctx.save_for_backward(*[t for t, kept in zip((*args, *outs), step.keep) if kept])
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:  # type: ignore[override]
        step: _Step = ctx.step
        bw = step.bw
        if bw is not None and not torch.is_grad_enabled() and not torch.compiler.is_compiling() \
                and torch._C._functorch.peek_interpreter_stack() is None:
            bk, brun, blay, sources, glay, positions = bw
            gs = []
            for k, want in glay:
                g = grads[k]
                if g is None or type(g) not in _PLAIN or not g.is_cpu or g.layout is not _STRIDED:
                    break
                g = g.contiguous()
                if (g.shape, g.dtype, g.stride()) != want:
                    break
                gs.append(g)
            else:
                extra = grads[step.n_user:]  # gradients of saved values: double backward
                if not (extra and any(g is not None for g in extra)) and bk._tensor_runner(blay) is brun:
                    saved = ctx.saved_tensors
                    got = brun([saved[i] if i >= 0 else gs[-1 - i] for i in sources])
                    got = got if type(got) is tuple else (got,)
                    result: list[torch.Tensor | None] = [None] * len(step.tc[1])
                    for i, g in zip(positions, got):
                        if i >= 0:
                            result[i] = g
                    return (None, *result)
        out = (None, *_autograd(ctx, list(grads))[1])
        _remember_backward(ctx, step, grads)  # the first backward of the layout, or its runner went stale
        return out


def _remember_backward(ctx: Any, step: _Step, grads: tuple[torch.Tensor | None, ...]) -> None:
    """After ``_autograd`` ran a ``_LeanStep``'s backward: the step's backward part, where that
    backward ran its kernel directly on the gradients given (else the part it had stays)."""
    key, needs, _, kept = step.tc
    plan = _PLANS.get((key, needs, False))
    if plan is None or torch.is_grad_enabled() or any(g is not None for g in grads[step.n_user:]):
        return
    bkey, sources, positions = plan
    e = _entry(key)
    names = [n for n, _ in e.outputs]
    used = sorted({names.index(name) for is_grad, name in sources if is_grad})
    given = [grads[k] for k in used]
    if any(g is None or not _eager([g]) for g in given):
        return
    gs = [g.contiguous() for g in given if g is not None]
    where = [-1 - used.index(names.index(name)) if is_grad else kept.index(name) for is_grad, name in sources]
    saved = ctx.saved_tensors
    bargs = [saved[i] if i >= 0 else gs[-1 - i] for i in where]
    bk = _REGISTRY[bkey].kernel
    blay = tuple([(a.shape, a.dtype, a.stride()) for a in bargs])
    brun = bk._tensor_runner(blay)
    if brun is not None:
        step.bw = (bk, brun, blay, where, [(k, (g.shape, g.dtype, g.stride())) for k, g in zip(used, gs)],
                   positions)


def _probe(kernel: Any) -> bool:
    """Whether this training call looks for gradcheck among its callers: the first 16 calls, then
    one in 32 (gradcheck calls a def many times; the stack walk costs microseconds)."""
    n = kernel.__dict__.get("_gradcheck_probes", 0)
    kernel._gradcheck_probes = n + 1
    return n < 16 or n % 32 == 0


def _narrow_gradients(tensors: list[torch.Tensor]) -> str:
    """The narrow float dtype of the tensors that require a gradient ('' if none is narrow)."""
    return next((str(a.dtype).removeprefix("torch.") for a in tensors
                 if a.requires_grad and a.dtype in (torch.float32, torch.float16, torch.bfloat16)), "")


_GRADCHECK = os.path.join("torch", "autograd", "gradcheck.py")


def _under_gradcheck(depth: int = 24) -> bool:
    """Whether ``torch.autograd.gradcheck`` (or gradgradcheck) is among the callers."""
    f: Any = sys._getframe(1)
    while f is not None and depth:
        if f.f_code.co_filename.endswith(_GRADCHECK):
            return True
        f, depth = f.f_back, depth - 1
    return False


def _outside_tcdsl() -> int:
    """The ``stacklevel`` of a warning that names the first caller outside tcdsl."""
    here = os.path.dirname(__file__)
    f: Any = sys._getframe(1)
    level = 1
    while f is not None and f.f_code.co_filename.startswith(here):
        f, level = f.f_back, level + 1
    return level


def _call_out(kernel: Any, tensors: list[torch.Tensor], out: Any, backend: str | None, options: Any) -> Any:
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*tensors, *outs)):
        raise TcArgumentError(f"{kernel.name}(): out= records no gradient; call it without out= (or under "
                              f"torch.no_grad())", kernel.checked.source.name.span.location())
    for o in outs:
        if not isinstance(o, torch.Tensor) or o.device.type != "cpu":
            raise TcArgumentError(f"{kernel.name}(): out= takes CPU torch tensors when the inputs are tensors",
                                  kernel.checked.source.name.span.location())
    key = _forward_key(kernel, backend, options, False)
    args = [a.detach() for a in tensors]
    if _eager([*args, *outs]):  # the op's dispatch skipped: the kernel, and the mutation told to autograd
        _write(key, args, outs)
        increment_version(outs)
    else:
        _update(key, args, outs)
    return out


def _write(key: str, args: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    """The kernel of ``key`` writing into ``outs`` (a repeated call: the numpy views' ``out=`` path)."""
    e = _entry(key)
    views = [o.numpy() for o in outs]
    e.kernel(*[a.numpy() for a in args], out=views if len(views) > 1 else views[0], backend=e.backend,
             options=e.options)


@torch.library.custom_op("tcdsl::update", mutates_args=("outs",))
def _update(key: str, args: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    """The kernel writing into the caller's ``out=`` tensors (marked as mutated: outputs that a
    reduction without ``!`` updates are read too)."""
    _write(key, args, outs)


@_update.register_fake
def _update_fake(key: str, args: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
    return None


_NUMPY_OF = {t: np.dtype(name).str for name, t in _TORCH_DTYPES.items()}


@torch.compiler.assume_constant_result  # under torch.compile: a constant while tracing, no tensor looked into
def _generic_key(generic: Any, sig: tuple[tuple[str, tuple[int, ...]], ...], backend: str | None, options: Any,
                 train: bool) -> str:
    """The forward key of the def a short-form kernel makes for tensors of these dtypes and shapes."""
    kernel = generic.kernel(*[np.empty(shape, dtype=np.dtype(d)) for d, shape in sig])
    if kernel.checked.accumulates:
        raise accumulate_error(kernel.checked)
    return _forward_key(kernel, backend or generic.backend, options, train)


def _functorch_wrapped(args: tuple[Any, ...]) -> bool:
    """Whether a tensor is one of functorch's wrappers (``torch.vmap``'s batched tensors)."""
    return any(isinstance(a, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(a) for a in args)


def call_generic(generic: Any, args: tuple[Any, ...], out: Any = None, backend: str | None = None,
                 options: Any = None) -> Any:
    """A short-form kernel on torch tensors: the def is made from the tensors' dtypes and shapes.
    Under ``torch.compile`` (CPU tensors, no ``out=``) the def is found from those alone, so the
    graph does not break on looking into the tensors; so it is under ``torch.vmap``, whose tensors
    have no storage to look into."""
    if ((torch.compiler.is_compiling() or _functorch_wrapped(args)) and out is None  # under torch.vmap: no storage
            and all(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)):
        sig = tuple((_NUMPY_OF[a.dtype], tuple(a.shape)) for a in args)
        train = torch.is_grad_enabled() and any(a.requires_grad for a in args)
        key = _generic_key(generic, sig, backend, options, train)
        res = _forward(key, list(args))
        n = _entry(key).n_user_outputs
        return res[0] if n == 1 else tuple(res[:n])
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.layout is not torch.strided:
            raise TcArgumentError(f"argument {i + 1} is a {str(a.layout).removeprefix('torch.')} tensor; tcdsl "
                                  "reads strided (dense) tensors: convert it with .to_dense()")
    plain = [a.detach().numpy() if isinstance(a, torch.Tensor) and a.device.type == "cpu" else a for a in args]
    kernel = generic.kernel(*plain)
    if all(type(a) in _PLAIN and a.is_cpu and a.layout is _STRIDED for a in args):
        generic._remember(tuple([(a.shape, a.dtype) for a in args]), kernel)  # (generic_repeated)
    return call(kernel, args, out=out, backend=backend or generic.backend, options=options)


def generic_repeated(generic: Any, args: tuple[Any, ...], out: Any, backend: str | None, options: Any) -> Any:
    """``call_generic``'s result for plain CPU tensors outside any tracing, where an earlier call
    made the kernel for tensors of these shapes and dtypes: that kernel's own call (its repeated
    path); None otherwise."""
    key = []
    for a in args:
        if type(a) not in _PLAIN or not a.is_cpu or a.layout is not _STRIDED:
            return None
        key.append((a.shape, a.dtype))
    kernel = generic._hot.get(tuple(key))
    if kernel is None or torch.compiler.is_compiling() or (
            torch._C._functorch.peek_interpreter_stack() is not None and _functorch_wrapped(args)):
        return None
    return kernel(*args, out=out, backend=backend, options=options)
