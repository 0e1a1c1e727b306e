"""GPU runtimes: ``GpuLowered -> a callable on arrays``, through pyopencl (OpenCL; PoCL runs it on
any CPU) and through cupy (CUDA, compiled with NVRTC).

Device buffers are C-contiguous; every kernel of a program takes every tensor and the error
flags, and the kernels run in order on one queue (stream). A failed run-time check (a gather
out of range, an integer division by zero) raises ``TcRuntimeError`` naming the statement, like
the C backend.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from typing import Any

import numpy as np

from .codegen.gpu import ERR_INTS
from .compiler import runtime_error
from .core.errors import TcArgumentError, TcCompileError
from .core.instance import fully_written
from .polyhedral.gpu import SM90, GpuTarget

_LOCK = threading.Lock()
# An empty input still gets a buffer of one element of the widest type: a failed check reads
# element 0 of its tensor (and reports the error) rather than outside every buffer.
EMPTY_BYTES = 8


# ---- OpenCL ---------------------------------------------------------------------------------------


@functools.cache
def opencl() -> tuple[Any, Any, Any]:
    """(pyopencl, context, queue) on the first GPU device, else the first device of any kind."""
    try:
        import pyopencl as cl
    except ImportError:
        raise TcArgumentError("backend 'opencl' needs pyopencl (pip install pyopencl) and an OpenCL "
                              "platform (Debian: apt install pocl-opencl-icd)") from None
    try:
        platforms = cl.get_platforms()
    except Exception as e:  # noqa: BLE001 - pyopencl raises LogicError when no ICD is installed
        raise TcArgumentError(f"backend 'opencl': no OpenCL platform ({e}); on Debian, "
                              "apt install pocl-opencl-icd") from None
    devices = [d for p in platforms for d in p.get_devices()]
    if not devices:
        raise TcArgumentError("backend 'opencl': the OpenCL platforms list no device")
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    dev = (gpus or devices)[0]
    ctx = cl.Context([dev])
    return cl, ctx, cl.CommandQueue(ctx)


def opencl_available() -> bool:
    try:
        opencl()
    except TcArgumentError:
        return False
    return True


@functools.lru_cache(maxsize=256)
def _cl_program(text: str) -> Any:
    cl, ctx, _ = opencl()
    try:
        return cl.Program(ctx, text).build()
    except cl.RuntimeError as e:
        raise TcCompileError(f"the OpenCL compiler rejected the generated kernel: {e}") from None


class OpenCLKernel:
    """A compiled OpenCL program for one instance and options; numpy arrays in and out."""

    def __init__(self, low: Any) -> None:
        self.low = low
        self.inst = low.scop.inst
        cl, ctx, queue = opencl()
        with _LOCK:
            prg = _cl_program(low.source.text)
        self.kernels = [(cl.Kernel(prg, k.name), k) for k in low.source.kernels]
        self.unwritten_ok = {t.name for t in (*self.inst.checked.outputs, *self.inst.checked.temps)
                             if fully_written(self.inst, t.name)}

    def __call__(self, inputs: dict[str, np.ndarray],
                 initial: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run on ``inputs``; the outputs in ``initial`` start from its values, the others from 0."""
        cl, ctx, queue = opencl()
        c = self.inst.checked
        mf = cl.mem_flags
        host: dict[str, np.ndarray] = {}
        bufs: dict[str, Any] = {}
        for t in c.inputs:
            a = np.ascontiguousarray(inputs[t.name], dtype=_device_dtype(t.dtype))
            host[t.name] = a
            bufs[t.name] = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a) if a.nbytes else \
                cl.Buffer(ctx, mf.READ_ONLY, EMPTY_BYTES)
        for t in (*c.outputs, *c.temps):
            shape = self.inst.shapes[t.name]
            start = (initial or {}).get(t.name)
            a = np.zeros(shape, dtype=_device_dtype(t.dtype)) if start is None else \
                np.array(start, dtype=_device_dtype(t.dtype), order="C")
            host[t.name] = a
            copy = a.nbytes and (t.name not in self.unwritten_ok or start is not None)
            flags = mf.READ_WRITE | (mf.COPY_HOST_PTR if copy else 0)
            bufs[t.name] = cl.Buffer(ctx, flags, hostbuf=a if flags & mf.COPY_HOST_PTR else None,
                                     size=0 if flags & mf.COPY_HOST_PTR else max(a.nbytes, 1))
        err = np.zeros(ERR_INTS, dtype=np.int32)
        err_buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=err)
        args = [bufs[n] for n in self.low.source.params] + [err_buf]
        for kern, spec in self.kernels:
            gsize = tuple(g * b for g, b in zip(spec.grid, spec.block))
            kern(queue, gsize, spec.block, *args)
        for t in c.outputs:
            if host[t.name].nbytes:
                cl.enqueue_copy(queue, host[t.name], bufs[t.name])
        cl.enqueue_copy(queue, err, err_buf)
        queue.finish()
        _check_flags(self.inst, self.low, err)
        return {t.name: host[t.name].astype(t.dtype, copy=False) for t in c.outputs}


# ---- CUDA -----------------------------------------------------------------------------------------


def cuda_available() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:  # noqa: BLE001 - no driver
        return False


def _cupy() -> Any:
    if not cuda_available():
        raise TcArgumentError("backend 'cuda' needs cupy (pip install cupy-cuda13x) and a CUDA device")
    import cupy

    return cupy


class CudaKernel:
    """A compiled CUDA program (NVRTC through cupy) for one instance and options; cupy arrays in and
    out."""

    def __init__(self, low: Any) -> None:
        cp = _cupy()
        self.low = low
        self.inst = low.scop.inst
        try:
            mod = cp.RawModule(code=low.source.text, options=("--std=c++17", "-diag-suppress=177"),
                               name_expressions=None)
            self.kernels = [(mod.get_function(k.name), k) for k in low.source.kernels]
        except cp.cuda.compiler.CompileException as e:
            raise TcCompileError(f"NVRTC rejected the generated kernel: {e}") from None
        self.unwritten_ok = {t.name for t in (*self.inst.checked.outputs, *self.inst.checked.temps)
                             if fully_written(self.inst, t.name)}
        self.key = hashlib.sha256(low.source.text.encode()).hexdigest()[:16]

    def __call__(self, inputs: dict[str, Any], initial: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run on ``inputs``; the outputs in ``initial`` start from its values, the others from 0."""
        cp = _cupy()
        c = self.inst.checked
        arrays: dict[str, Any] = {}
        for t in c.inputs:
            a = cp.ascontiguousarray(cp.asarray(inputs[t.name]), dtype=_device_dtype(t.dtype))
            arrays[t.name] = a if a.size else cp.zeros(1, dtype=a.dtype)  # see EMPTY_BYTES
        for t in (*c.outputs, *c.temps):
            shape = self.inst.shapes[t.name]
            start = (initial or {}).get(t.name)
            if start is not None:
                arrays[t.name] = cp.array(cp.asarray(start), dtype=_device_dtype(t.dtype), order="C")
                continue
            alloc = cp.empty if t.name in self.unwritten_ok else cp.zeros
            arrays[t.name] = alloc(shape, dtype=_device_dtype(t.dtype))
        err = cp.zeros(ERR_INTS, dtype=cp.int32)
        args = [arrays[n] for n in self.low.source.params] + [err]
        for fn, spec in self.kernels:
            fn(spec.grid, spec.block, args)
        _check_flags(self.inst, self.low, err.get())
        return {t.name: arrays[t.name].astype(t.dtype, copy=False) for t in c.outputs}


def _check_flags(inst: Any, low: Any, flags: np.ndarray) -> None:
    """Raise the located error a kernel recorded in its flags (int32 code, pad, int64 value)."""
    if flags[0]:
        value = int(np.ascontiguousarray(flags[2:4]).view(np.int64)[0])
        raise runtime_error(inst, low.source.errors, int(flags[0]), value)


def _device_dtype(dtype: str) -> str:
    """float16 tensors live in float32 device buffers (holding values rounded to half)."""
    return "float32" if dtype == "float16" else dtype


def cuda_target() -> Any:
    """The limits of the current CUDA device (sm_90's when there is none)."""
    if not cuda_available():
        return SM90
    cp = _cupy()
    dev = cp.cuda.Device()
    a = dev.attributes
    return GpuTarget(name=f"sm_{dev.compute_capability}", max_threads=a["MaxThreadsPerBlock"],
                     max_block=(a["MaxBlockDimX"], a["MaxBlockDimY"], a["MaxBlockDimZ"]),
                     max_grid=(a["MaxGridDimX"], a["MaxGridDimY"], a["MaxGridDimZ"]),
                     max_shared=min(a["MaxSharedMemoryPerBlock"], 48 * 1024))


def is_device_array(x: Any) -> bool:
    """A cupy array (arguments on a CUDA device)."""
    mod = type(x).__module__
    return mod.startswith("cupy")


def is_torch_cuda(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and getattr(x, "is_cuda", False)


def torch_cuda_call(kernel: Any, args: Any, out: Any = None, backend: str | None = None, options: Any = None) -> Any:
    """``kernel`` on torch CUDA tensors, where no gradient is recorded (``tcdsl.torch_ops`` runs
    the differentiable calls): shared with cupy through DLPack (no copies), run on the CUDA
    backend, results returned as torch tensors on the same device."""
    import torch

    if backend not in (None, "cuda"):
        raise TcArgumentError(f"{kernel.name}(): the tensors are on a CUDA device; backend {backend!r} runs on the "
                              "host (move them with .cpu(), or use backend='cuda')")
    if out is not None and torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in args):
        raise TcArgumentError(f"{kernel.name}(): out= records no gradient; call it without out= (or under "
                              "torch.no_grad())")
    cp = _cupy()
    conv = []
    for a in args:
        if not is_torch_cuda(a):
            raise TcArgumentError(f"{kernel.name}(): mixing CUDA tensors with {type(a).__name__} arguments")
        conv.append(cp.from_dlpack(a.contiguous()))
    if out is not None:  # written in place through DLPack views (outputs updated in place read them too)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not all(is_torch_cuda(o) and o.is_contiguous() for o in outs):
            raise TcArgumentError(f"{kernel.name}(): out= takes contiguous CUDA tensors when the inputs are on "
                                  "a CUDA device")
        views = [cp.from_dlpack(o.detach()) for o in outs]
        kernel(*conv, out=views if isinstance(out, (tuple, list)) else views[0], backend="cuda", options=options)
        return out
    res = kernel(*conv, backend="cuda", options=options)
    values = [torch.from_dlpack(r) for r in (res if isinstance(res, tuple) else (res,))]
    return values[0] if len(values) == 1 else tuple(values)


__all__ = ["OpenCLKernel", "CudaKernel", "opencl", "opencl_available", "cuda_available", "cuda_target",
           "is_device_array", "is_torch_cuda", "torch_cuda_call"]
