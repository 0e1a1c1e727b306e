"""The compiler driver: ``Instance x MappingOptions -> Lowered`` (every stage, in order), and the C
backend that builds and calls it.

    Instance -> Scop -> Deps -> schedule -> transformed schedule -> LoopIR -> lowering passes
             -> LoopIR -> CSource -> library

Each stage's text form is kept, for ``kernel.schedule()`` / ``kernel.source()`` and the
``TCDSL_DUMP_DIR`` knob.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import islpy as isl
import numpy as np

from .codegen import c as cgen
from .codegen import entry as centry
from .codegen import gpu as gpu_cgen
from .codegen import gpulower as gpu_passes
from .codegen import lower as cpu_passes
from .codegen import toolchain
from .codegen.cexpr import ErrorSite
from .codegen.facts import Facts
from .codegen.gpu import GpuSource
from .core import knobs
from .core.errors import TcRuntimeError, TcScheduleError
from .core.instance import Instance, Regions, fully_written, unwritten
from .core.options import MappingOptions
from .polyhedral import astgen, gpu, schedule, transform, trim
from .polyhedral.cputarget import CpuTarget
from .polyhedral.deps import Deps, dependences
from .polyhedral.gpu import SM90, GpuProgram, GpuTarget
from .polyhedral.loopir import LoopIR
from .polyhedral.scatter import atomic, scatters
from .polyhedral.scop import Scop, build_scop


@dataclass(frozen=True)
class Lowered:
    scop: Scop
    deps: Deps
    tree: isl.Schedule = field(compare=False)  # the scheduler's tree
    final: isl.Schedule = field(compare=False)  # after the CPU transformations
    ir: LoopIR  # as isl's AST gives it
    passes: tuple[tuple[str, LoopIR], ...]  # after each lowering pass (codegen.lower), in order
    source: cgen.CSource
    strides: dict[str, tuple[int, ...]] = field(compare=False)  # each tensor's element strides
    options: MappingOptions = field(compare=False)  # the options, their fusion strategy decided
    fusion_why: str = field(compare=False)  # how the schedule stage decided it

    @property
    def lowered_ir(self) -> LoopIR:
        """The loop IR the C emitter prints (after the last pass)."""
        return self.passes[-1][1] if self.passes else self.ir


def strides_of(inst: Instance, inputs: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Element strides: the inputs' own, C order for outputs and temporaries."""
    out = {}
    c = inst.checked
    for t in c.inputs:
        a = inputs[t.name]
        out[t.name] = tuple(s // a.itemsize for s in a.strides) if a.ndim else ()
    for t in (*c.outputs, *c.temps):
        shape = inst.shapes[t.name]
        st, acc = [], 1
        for n in reversed(shape):
            st.append(acc)
            acc *= max(n, 1)
        out[t.name] = tuple(reversed(st))
    return out


@contextlib.contextmanager
def _isl_failures(inst: Instance, options: MappingOptions) -> Iterator[None]:
    """isl's own failures surface as a ``TcScheduleError`` located at the def's first statement,
    naming the options (users never see ``isl_...``)."""
    try:
        yield
    except isl.Error as e:
        first = inst.checked.stmts[0] if inst.checked.stmts else None
        loc = first.span.location() if first is not None else None  # type: ignore[attr-defined]
        raise TcScheduleError(f"def {inst.checked.name} could not be scheduled with {options}: isl failed "
                              f"({str(e).split(' in /')[0]})", loc) from None


def cpu_target() -> CpuTarget:
    """The CPU target C kernels compile for now (``$TCDSL_CPU``, else the machine's own)."""
    return toolchain.target()


def lower(inst: Instance, options: MappingOptions, strides: dict[str, tuple[int, ...]],
          target: CpuTarget | None = None) -> Lowered:
    """Every stage for the C backend, for ``target`` (default: ``toolchain.target()``)."""
    with _isl_failures(inst, options):
        return _lower(inst, options, strides, target or toolchain.target())


def _lower(inst: Instance, options: MappingOptions, strides: dict[str, tuple[int, ...]],
           target: CpuTarget) -> Lowered:
    scop = build_scop(scatters(inst))
    deps = dependences(scop)
    tree, options, why = schedule.with_default_fusion(scop, deps, options)
    final = trim.run(transform.transform(tree, scop, deps, options, target))
    ir = astgen.build(final, scop.context, deps.all, options)
    vector_math = toolchain.has_vector_math()
    passes = cpu_passes.run(ir, Facts(scop, strides, target, options.vectorize, vector_math, options.unroll))
    src = cgen.emit(passes[-1][1], scop, strides, target, vectorize=options.vectorize, vector_math=vector_math)
    low = Lowered(scop, deps, tree, final, ir, passes, src, strides, options, why)
    _dump(low)
    return low


def _dump(low: Lowered) -> None:
    d = knobs.dump_dir()
    if d is None:
        return
    d.mkdir(parents=True, exist_ok=True)
    name = low.scop.inst.checked.name
    (d / f"{name}.scop.txt").write_text(str(low.scop) + "\n\n" + str(low.deps) + "\n")
    (d / f"{name}.schedule.txt").write_text(f"# {low.fusion_why}\n{low.tree.get_root()}\n\n{low.final.get_root()}\n")
    (d / f"{name}.loops.txt").write_text(str(low.ir) + "\n")
    (d / f"{name}.passes.txt").write_text(cpu_passes.trace(low.passes, low.ir))
    (d / f"{name}.c").write_text(low.source.text)


# glibc's mallopt parameters and the values TCDSL_KEEP_HEAP sets (see core.knobs.keep_heap)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_MMAP_BYTES, HEAP_TRIM_BYTES = 32 << 20, 128 << 20
_heap_kept = False


def keep_heap() -> bool:
    """Let glibc keep freed blocks of up to 32 MiB in the heap for reuse, once per process (see
    core.knobs.keep_heap). By default glibc maps such blocks afresh or trims them back to the system
    as they are freed, so each call's outputs and temporaries of megabytes are new pages, whose
    first touches fault: softmax forward + backward 2000x1000 took 800 faults and 4-9 ms of system
    time a step beside torch's (7-11 ms against 3.1-3.5 ms with the heap kept, on a VM where a fault
    costs microseconds). Returns whether the thresholds were set."""
    global _heap_kept
    if _heap_kept or not knobs.keep_heap():
        return False
    _heap_kept = True
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False  # the process chose its own
    try:
        libc = ctypes.CDLL(None)
        mallopt, _ = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_BYTES) and mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_BYTES))


def library_text(low: Lowered) -> str:
    """The C text of ``low``'s library: its kernel and, in CPython, the entry a repeated call runs
    on the arrays' objects (``codegen.entry``)."""
    n = len(low.source.params)
    if _HEADER is None or not n:
        return low.source.text
    return low.source.text + centry.object_entry(low.source.name, n, _HEADER)


class CKernel:
    """A compiled C kernel for one instance, options and stride signature."""

    def __init__(self, low: Lowered) -> None:
        keep_heap()
        self.low = low
        self.inst = low.scop.inst
        n = len(low.source.params)
        text = library_text(low)
        lib, symbol, path = toolchain.kernel_library(text, f"tc_{self.inst.checked.name}", entry=low.source.name)
        fn = getattr(lib, symbol)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * (n + 1)
        self.fn = fn
        self._objects: Any = None  # (the entry on objects, its error record's reader), or None
        if text is not low.source.text and hasattr(lib, f"{symbol}_objects") and hasattr(lib, f"{symbol}_failure"):
            objects, failure = getattr(lib, f"{symbol}_objects"), getattr(lib, f"{symbol}_failure")
            objects.restype, objects.argtypes = ctypes.c_int, [ctypes.c_void_p] * n
            failure.restype, failure.argtypes = None, [ctypes.c_void_p]
            self._objects = (objects, failure)
        self.path = path
        self.unwritten_ok = {t.name for t in (*self.inst.checked.outputs, *self.inst.checked.temps)
                             if fully_written(self.inst, t.name)}  # every element written: no zeroing
        c = self.inst.checked
        buffers = dict(low.source.buffers)
        position = {n: k for k, n in enumerate(low.source.params)}
        # run()'s plan: where each input goes among the C parameters, and how the rest are made
        self._inputs = [(position.get(t.name), bool(math.prod(self.inst.shapes[t.name]))) for t in c.inputs]
        # the parts of each output to zero (None: all of it), the rest written by the kernel
        self._zeros = [unwritten(self.inst, t.name) for t in c.outputs]
        self._fresh = [(position.get(t.name), self.inst.shapes[t.name], np.dtype(t.dtype), zeros)
                       for t, zeros in zip(c.outputs, self._zeros)]
        # (output's position among the C parameters, how to make it), for calls with no ``outputs``
        self._makers = [(at, _maker(shape, dtype, zeros)) for at, shape, dtype, zeros in self._fresh]
        self._nonempty = all(n for _, n in self._inputs) and all(math.prod(sh) for _, sh, _, _ in self._fresh)
        self._params = len(low.source.params)
        # (temporary's position among the C parameters, how to make its buffer: one element where the
        # kernel keeps it in registers or on its stack, zeroed where a sharer needs zeros)
        self._temp_makers: list[tuple[int, Callable[[], np.ndarray]]] = []
        for t in c.temps:
            if t.name in position:
                size = buffers.get(t.name, 0)
                make = np.zeros if t.name not in self.unwritten_ok or not size else np.empty
                self._temp_makers.append((position[t.name], functools.partial(make, max(size, 1), dtype=t.dtype)))
        self._plain = self._nonempty
        self._errors = threading.local()  # run_at's error record, one per calling thread, reused

    def writes_in_place(self, inputs: dict[str, np.ndarray], outs: list[np.ndarray]) -> bool:
        """Whether caller buffers can take the results directly: the kernel cannot fail half-way
        (no run-time checks; a failed allocation stops it before it writes anything), the buffers
        are C-contiguous and aligned, and none overlaps an input."""
        if any(e.kind not in ("memory", "partials") for e in self.low.source.errors):
            return False
        return all(o.flags.c_contiguous and o.flags.aligned and not any(np.may_share_memory(o, a)
                                                                       for a in inputs.values())
                   for o in outs)

    def __call__(self, inputs: dict[str, np.ndarray], outs: list[np.ndarray] | None = None,
                 initial: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run on ``inputs``; results go to fresh arrays, or into ``outs`` (see ``writes_in_place``).
        The outputs a call updates in place (``CheckedDef.accumulates``) start from their values
        in ``outs``, or in ``initial`` when the results go to fresh arrays."""
        c = self.inst.checked
        given: list[np.ndarray | None] | None = None
        if outs is not None or initial:
            given = []
            for k, t in enumerate(c.outputs):
                if outs is not None:
                    if t.name not in c.accumulates:
                        _clear(outs[k], self._zeros[k])
                    given.append(outs[k])
                elif initial and t.name in initial:
                    given.append(np.array(initial[t.name], dtype=t.dtype, order="C"))
                else:
                    given.append(None)
        made = self.run([inputs[t.name] for t in c.inputs], given)
        return dict(zip((t.name for t in c.outputs), made))

    def run(self, inputs: Sequence[np.ndarray],
            outputs: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
        """Run on ``inputs`` (in the def's order, C-ready); results go to ``outputs`` where given
        (C-contiguous, in the def's order), else to fresh arrays; returns the output arrays. A
        repeated call's fast path: its plan is made once, in ``__init__``."""
        if outputs is None and self._plain:
            return self.run_at([data_address(a) for a in inputs])
        addresses = [0] * (self._params + 1)  # every parameter is a tensor of the def, then the error record
        held = []  # what the addresses point into, alive until the call returns
        # an empty tensor is passed as one zeroed element: a failing check may load it before it raises
        for (at, nonempty), a in zip(self._inputs, inputs):
            if at is not None:
                if not nonempty:
                    a = np.zeros(1, a.dtype)
                    held.append(a)
                addresses[at] = data_address(a)
        made = []
        for k, (at, shape, dtype, zeros) in enumerate(self._fresh):
            o = outputs[k] if outputs is not None else None
            if o is None:
                o = _output(shape, dtype, zeros)
            made.append(o)
            if at is not None:
                if not o.size:
                    o = np.zeros(1, dtype)
                    held.append(o)
                addresses[at] = data_address(o)
        # owners get a buffer for their group (the kernel zeroes what sharers need)
        for at, make in self._temp_makers:
            t = make()
            held.append(t)
            addresses[at] = data_address(t)
        err = np.zeros(2, dtype=np.int64)
        addresses[-1] = data_address(err)
        code = self.fn(*addresses)
        if code:
            raise self._error(int(err[0]), int(err[1]))
        return made

    def direct(self, address: Callable[[Any], int], wrap: Callable[[np.ndarray], Any] | None = None
               ) -> Callable[[Sequence[Any]], Any]:
        """A repeated call's whole run, built once: ``run_at`` on the inputs' addresses (``address``
        of each), returning the output (``wrap`` of it where given), or a tuple of them. Needs
        ``plain``. The common kernel (its inputs in order, then its one output, no temporaries'
        buffers) runs in one call of a few microseconds."""
        n = len(self._inputs)
        common = ([at for at, _ in self._inputs] == list(range(n)) and len(self._makers) == 1
                  and self._makers[0][0] == n and self._params == n + 1)
        if not common:
            def general(inputs: Sequence[Any]) -> Any:
                made = self.run_at([address(a) for a in inputs])
                if wrap is not None:
                    made = [wrap(o) for o in made]
                return made[0] if len(made) == 1 else tuple(made)
            return general
        fn, errors, error, make = self.fn, self._errors, self._error, self._makers[0][1]
        if address is data_address and wrap is None and self._objects is not None:  # ndarrays: the entry on objects
            objects, failure = self._objects

            def run_objects(inputs: Sequence[Any]) -> Any:
                o = make()
                if objects(*map(id, inputs), id(o)):
                    raise _failure(failure, error)
                return o

            if n != 1:
                return run_objects

            def run1(inputs: Sequence[Any]) -> Any:
                o = make()
                if objects(id(inputs[0]), id(o)):
                    raise _failure(failure, error)
                return o
            return run1

        def run(inputs: Sequence[Any]) -> Any:
            o = make()
            err, rec = getattr(errors, "record", None) or _error_record(errors)
            if fn(*map(address, inputs), data_address(o), rec):
                raise _failed(err, error)
            return o if wrap is None else wrap(o)
        return run

    def direct_into(self) -> Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]:
        """A repeated call's run into the caller's arrays (``out=``), built once: the outputs the
        kernel neither writes whole nor updates are zeroed, then the kernel runs on the arrays'
        objects where its parameters are the def's inputs and outputs in order, else as ``run``
        into them. Needs ``plain``, and ``writes_in_place`` of the call's arrays."""
        c = self.inst.checked
        ins = [at for at, _ in self._inputs]
        outs_at = [at for at, *_ in self._fresh]
        zero = [(k, self._zeros[k]) for k, t in enumerate(c.outputs) if self._zeros[k] != () and
                t.name not in c.accumulates]
        if self._objects is not None and ins + outs_at == list(range(self._params)):
            objects, failure = self._objects  # every parameter is an input or an output, in order: no addresses

            def into_objects(inputs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
                for k, zeros in zero:
                    _clear(outs[k], zeros)
                if objects(*map(id, inputs), *map(id, outs)):
                    raise _failure(failure, self._error)
            return into_objects

        def into(inputs: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
            for k, zeros in zero:
                _clear(outs[k], zeros)
            self.run(inputs, outs)
        return into

    @property
    def plain(self) -> bool:
        """Whether ``run_at`` can run it: no empty tensor."""
        return self._plain

    def run_at(self, inputs: Sequence[int]) -> list[np.ndarray]:
        """``run`` with fresh outputs on inputs given by the addresses of their first elements
        (torch tensors' ``data_ptr()``), laid out as the inputs this kernel was compiled for;
        needs ``plain``."""
        addresses = [0] * (self._params + 1)
        for (at, _), a in zip(self._inputs, inputs):
            if at is not None:
                addresses[at] = a
        made = []
        for at, make in self._makers:
            o = make()
            made.append(o)
            if at is not None:
                addresses[at] = data_address(o)
        held = [make() for _, make in self._temp_makers]  # alive until the call returns
        for (at, _), t in zip(self._temp_makers, held):
            addresses[at] = data_address(t)
        try:
            err, addresses[-1] = self._errors.record
        except AttributeError:  # this thread's first call
            err, addresses[-1] = _error_record(self._errors)
        if self.fn(*addresses):
            raise _failed(err, self._error)
        return made

    def _error(self, code: int, value: int) -> TcRuntimeError:
        return runtime_error(self.inst, self.low.source.errors, code, value)


ALIGN = 64  # bytes: a cache line, and AVX-512's vector (streamed stores need their vector's alignment)
ALIGN_FROM = 64 * 1024  # bytes: smaller outputs take numpy's own alignment (16 bytes), which costs no slicing


def _error_record(errors: threading.local) -> tuple[np.ndarray, int]:
    """This thread's error record for repeated calls, made on its first: the array and its address."""
    err = np.zeros(2, dtype=np.int64)
    errors.record = (err, _addressof(_char_at(err)))
    return errors.record  # type: ignore[no-any-return]


def _failed(err: np.ndarray, error: Callable[[int, int], TcRuntimeError]) -> TcRuntimeError:
    """The error a failed repeated call raises, read from its thread's record, which is then
    cleared: the record is the thread's next call's too, and the kernel writes only into a clear one."""
    code, value = int(err[0]), int(err[1])
    err[:] = 0
    return error(code, value)


def _failure(failure: Callable[[int], None], error: Callable[[int, int], TcRuntimeError]) -> TcRuntimeError:
    """The error a call through a kernel's entry on objects failed with, from its thread's record
    in the library (``failure`` copies it out and clears it)."""
    err = np.zeros(2, dtype=np.int64)
    failure(data_address(err))
    return error(int(err[0]), int(err[1]))


def _clear(a: np.ndarray, zeros: Regions | None) -> None:
    """Zero the ``zeros`` regions of ``a`` (None: all of it)."""
    if zeros is None:
        a.fill(0)
        return
    for region in zeros:
        a[region] = 0


def _output(shape: tuple[int, ...], dtype: np.dtype, zeros: Regions | None) -> np.ndarray:
    """A fresh output array, its ``zeros`` regions zeroed (None: all of it); from ALIGN_FROM
    bytes, aligned to ALIGN bytes (numpy's arrays are 16-byte aligned; a streamed store to an
    unaligned vector falls back to a plain one). Only the parts the kernel leaves are zeroed: a
    fresh array of reused memory costs a pass to zero (16 MB of float32 written from its second
    element: 1.14 ms against 0.69 for the whole array written)."""
    n = math.prod(shape) * dtype.itemsize
    if n < ALIGN_FROM:
        o = (np.zeros if zeros is None else np.empty)(shape, dtype=dtype)
    else:
        raw = (np.zeros if zeros is None else np.empty)(n + ALIGN, dtype=np.uint8)
        at = -data_address(raw) % ALIGN
        o = raw[at:at + n].view(dtype).reshape(shape)
    for region in zeros or ():
        o[region] = 0
    return o


def _maker(shape: tuple[int, ...], dtype: np.dtype, zeros: Regions | None) -> Callable[[], np.ndarray]:
    """A maker of fresh output arrays: numpy's own below ALIGN_FROM bytes where nothing or all is
    zeroed, else ``_output``'s."""
    if math.prod(shape) * dtype.itemsize < ALIGN_FROM and not zeros:
        return functools.partial(np.zeros if zeros is None else np.empty, shape, dtype)
    return functools.partial(_output, shape, dtype, zeros)


_char_at: Callable[[Any], ctypes.c_char] = ctypes.c_char.from_buffer
_addressof = ctypes.addressof
_pointer_at = ctypes.c_void_p.from_address


def _header_bytes() -> int | None:
    """Where an ndarray's object holds the address of its first element (``PyArrayObject``'s
    ``data``, right after the object header), checked on arrays of several layouts; None where the
    interpreter is not CPython or the check fails."""
    if sys.implementation.name != "cpython":
        return None
    at = object.__basicsize__
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    probes = (base, base[1:, 2:], base[::-1, ::2], np.zeros(3, np.float32), np.frombuffer(b"abcd", np.uint8))
    ok = all(_pointer_at(id(p) + at).value == p.ctypes.data for p in probes)
    return at if ok else None


_HEADER = _header_bytes()


def data_address(a: np.ndarray) -> int:
    """The address of ``a``'s first element: read from the object where it is an ndarray (a tenth of
    the time ``a.ctypes.data`` takes), else through the buffer protocol, else through numpy."""
    if type(a) is np.ndarray and _HEADER is not None:
        return _pointer_at(id(a) + _HEADER).value or 0
    try:
        return _addressof(_char_at(a))
    except (TypeError, ValueError, BufferError):  # read-only, or not contiguous
        return a.ctypes.data  # type: ignore[no-any-return]


def runtime_error(inst: Instance, errors: tuple[ErrorSite, ...], code: int, value: int) -> TcRuntimeError:
    """The located error for a failed run-time check (``code`` indexes ``errors``)."""
    site = next((e for e in errors if e.code == code), None)
    if site is None:
        return TcRuntimeError(f"kernel {inst.checked.name} failed with code {code}")
    s = inst.checked.statement(site.stmt)
    loc = site.span.location()  # type: ignore[attr-defined]
    if site.kind in ("division", "modulo"):
        return TcRuntimeError(f"integer {site.kind} by zero in {s.describe()}", loc)
    if site.kind == "memory":
        return TcRuntimeError(f"kernel {inst.checked.name} could not allocate {value} bytes for the packed "
                              f"panels of '{site.tensor}' read by {s.describe()}", loc)
    if site.kind == "partials":
        return TcRuntimeError(f"kernel {inst.checked.name} could not allocate {value} bytes for the partial "
                              f"sums of '{site.tensor}' by blocks of rows in {s.describe()}", loc)
    return TcRuntimeError(f"{site.kind} out of range in {s.describe()}: dim {site.dim} of '{site.tensor}' is "
                          f"read at {value}, outside 0:{inst.shapes[site.tensor][site.dim]}", loc)


@dataclass(frozen=True)
class GpuLowered:
    scop: Scop
    deps: Deps
    tree: isl.Schedule = field(compare=False)  # the scheduler's tree
    final: isl.Schedule = field(compare=False)  # tiled and marked for the mapping
    program: GpuProgram  # as mapped
    passes: tuple[tuple[str, GpuProgram], ...]  # after each of codegen.gpulower's passes
    source: GpuSource


def lower_gpu(inst: Instance, options: MappingOptions, dialect: str, target: GpuTarget = SM90) -> GpuLowered:
    """Every stage for the GPU: schedule, tile and mark, map to blocks and threads, promote,
    place barriers, print ``dialect`` ("cuda" or "opencl"). Raises ``TcScheduleError`` for a
    mapping the device cannot run (before anything is compiled)."""
    with _isl_failures(inst, options):
        return _lower_gpu(inst, options, dialect, target)


def _lower_gpu(inst: Instance, options: MappingOptions, dialect: str, target: GpuTarget) -> GpuLowered:
    inst = scatters(inst)
    if options.fusion is None and any(s.scatter is not None for s in inst.checked.stmts):
        options = options.with_(fusion="preserve")  # the target's initialisation, a kernel of its own
    options = options.resolved(inst.checked)
    gpu.check_options(options, target)
    scop = build_scop(inst)
    deps = atomic(dependences(scop), scop)  # a scatter's updates add atomically on the GPU
    tree = schedule.compute(scop, deps, options)
    final, program = gpu.map_program(tree, scop, deps, options, target, name=f"tc_{inst.checked.name}")
    passes = gpu_passes.run(program, scop, options.private_memory)
    source = gpu_cgen.emit(passes[-1][1], scop, dialect, options.unroll, options.unroll_copy_shared)
    low = GpuLowered(scop, deps, tree, final, program, passes, source)
    d = knobs.dump_dir()
    if d is not None:
        d.mkdir(parents=True, exist_ok=True)
        name = inst.checked.name
        (d / f"{name}.gpu.txt").write_text(f"{final.get_root()}\n\n{program}\n")
        (d / f"{name}.gpu-passes.txt").write_text(gpu_passes.trace(passes, program))
        (d / f"{name}.{'cu' if dialect == 'cuda' else 'cl'}").write_text(source.text)
    return low
