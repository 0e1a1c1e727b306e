"""Call arguments: ``CheckedDef x arguments -> list[np.ndarray]`` (count, rank and dtype checked
against the def's params, errors located at them; CUDA arrays passed through) and ``out=`` checked
against an ``Instance``'s shapes; also the backends a call may name and its arguments' layout keys.
"""

from __future__ import annotations

import functools
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import gpurt
from .codegen import toolchain
from .core import dtypes as T
from .core.checked import CheckedDef
from .core.errors import Location, TcArgumentError
from .core.instance import Instance, accumulate_error

BACKENDS = ("c", "numpy", "opencl", "cuda")


def default_backend() -> str:
    """``c`` where a C compiler exists, else the reference interpreter."""
    return "c" if has_cc() else "numpy"


@functools.cache
def has_cc() -> bool:
    return shutil.which(toolchain.compiler()[0]) is not None


def torch_args(args: Sequence[Any]) -> bool:
    """Whether a call has torch tensors (then tcdsl.torch_ops runs it); never imports torch."""
    mod = sys.modules.get("torch")
    return mod is not None and any(isinstance(a, mod.Tensor) for a in args)


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise TcArgumentError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    return name


def as_array(x: Any, what: str, where: Location | None = None) -> np.ndarray:
    """``x`` as a native-order numpy array; anything else (None, str, list, objects) is refused
    with a located error naming the parameter."""
    if isinstance(x, np.ndarray):
        a = x
    elif isinstance(x, (bool, int, float, np.generic)):
        a = np.asarray(x)
    elif hasattr(x, "__array__") and not isinstance(x, type):
        try:
            a = np.asarray(x)
        except Exception as e:  # noqa: BLE001 (any failure of a foreign __array__)
            raise TcArgumentError(f"argument '{what}' is a {type(x).__name__} that numpy cannot convert to an "
                                  f"array ({type(e).__name__}: {e})", where) from None
        if not isinstance(a, np.ndarray):
            raise TcArgumentError(f"argument '{what}' is a {type(x).__name__}, not an array", where)
    else:
        hint = "; pass np.asarray(...) of it" if isinstance(x, (list, tuple)) else ""
        raise TcArgumentError(f"argument '{what}' is a {type(x).__name__}, not an array{hint}", where)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return a


def array_key(args: Sequence[Any]) -> tuple | None:
    """``layout_key`` of arguments that are all numpy arrays (else None)."""
    key = []
    for a in args:
        if type(a) is not np.ndarray:
            return None
        key.append((a.shape, a.dtype, a.strides))
    return tuple(key)


def layout_key(arrays: Sequence[np.ndarray]) -> tuple:
    """What a compiled kernel depends on in its arguments: their shapes, dtypes and byte strides
    (the dtype objects, byte order included: hashed faster than their ``.str``)."""
    return tuple((a.shape, a.dtype, a.strides) for a in arrays)


def tensor_key(tensors: Sequence[Any]) -> tuple:
    """What ``layout_key`` says of torch tensors' numpy views, read from the tensors."""
    return tuple([(a.shape, a.dtype, a.stride()) for a in tensors])


def c_ready(a: np.ndarray) -> np.ndarray:
    """``a`` as the C backend reads it: native byte order, element-aligned strides."""
    if a.ndim and any(s % a.itemsize for s in a.strides):
        return np.ascontiguousarray(a)
    return a


def _check_arity(checked: CheckedDef, args: Sequence[Any]) -> None:
    ins = checked.inputs
    if len(args) != len(ins):
        raise TcArgumentError(f"{checked.name}() takes {len(ins)} arguments ({', '.join(t.name for t in ins)}), "
                              f"got {len(args)}", checked.source.name.span.location())


def coerce_inputs(checked: CheckedDef, args: Sequence[Any]) -> list[np.ndarray]:
    _check_arity(checked, args)
    return [_coerce_input(checked, t, x) for t, x in zip(checked.inputs, args)]


def _coerce_input(checked: CheckedDef, t: Any, x: Any) -> np.ndarray:
    """One host argument as a numpy array of its parameter's type (a Python scalar for a scalar
    parameter included), or a located error."""
    if not t.dims and isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        kind_ok = T.is_float(t.dtype) or isinstance(x, (bool, int))
        if not kind_ok:
            raise TcArgumentError(f"'{t.name}' is {t.dtype} but the argument is the float {x!r}",
                                  t.span.location())
        try:
            return np.asarray(x, dtype=t.dtype)
        except OverflowError:
            raise TcArgumentError(f"'{t.name}' is {t.dtype} but {x!r} does not fit in it",
                                  t.span.location()) from None
    if t.dims and isinstance(x, (bool, int, float, np.generic)):
        raise TcArgumentError(f"'{t.name}' is declared with {len(t.dims)} dims but the argument is the scalar "
                              f"{x!r}", t.span.location())
    a = as_array(x, t.name, t.span.location())
    got = T.from_numpy(a.dtype)
    if got != t.dtype:
        hint = f" (convert it with .astype(np.{t.dtype}), or call {checked.name}.double(), the def in float64)" \
            if got == "float64" and t.dtype in ("float32", "float16") else ""
        raise TcArgumentError(f"'{t.name}' is declared {t.dtype} but the argument has dtype {a.dtype}{hint}",
                              t.span.location())
    return a


def coerce_any_inputs(checked: CheckedDef, args: Sequence[Any]) -> list[Any]:
    """Host arrays as ``coerce_inputs`` makes them; cupy arrays (on a CUDA device) checked the
    same way (count, rank, dtype) and passed through. A scalar parameter may stay on the host beside
    device arrays (a Python or numpy scalar, or a 0-d array): the call copies it to the device."""
    if not any(gpurt.is_device_array(a) for a in args):
        return list(coerce_inputs(checked, args))
    ins = checked.inputs
    _check_arity(checked, args)
    out = []
    for t, x in zip(ins, args):
        if not t.dims and not gpurt.is_device_array(x) and np.ndim(x) == 0:
            out.append(_coerce_input(checked, t, x))
            continue
        if not gpurt.is_device_array(x):
            raise TcArgumentError(f"'{t.name}' is on the host while other arguments are on a CUDA device",
                                  t.span.location())
        if T.from_numpy(x.dtype) != t.dtype:
            raise TcArgumentError(f"'{t.name}' is declared {t.dtype} but the argument has dtype {x.dtype}",
                                  t.span.location())
        out.append(x)
    return out


def initial_values(checked: CheckedDef, outs: list[Any] | None) -> dict[str, Any]:
    """The current values of the outputs that the call updates in place (``CheckedDef.accumulates``)."""
    if outs is None:
        return {}
    return {t.name: o for t, o in zip(checked.outputs, outs) if t.name in checked.accumulates}


def check_out(checked: CheckedDef, inst: Instance, out: Any, device: bool = False) -> list[Any] | None:
    if out is None:
        if checked.accumulates:
            raise accumulate_error(checked)
        return None
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(checked.outputs):
        raise TcArgumentError(f"out= holds {len(outs)} arrays but {checked.name} has {len(checked.outputs)} outputs",
                              checked.source.name.span.location())
    for t, dst in zip(checked.outputs, outs):
        if not (isinstance(dst, np.ndarray) or (device and gpurt.is_device_array(dst))):
            kind = "a CUDA array" if device else "a numpy array"
            raise TcArgumentError(f"out= for '{t.name}' is a {type(dst).__name__}, not {kind}", t.span.location())
        want = inst.shapes[t.name]
        if dst.shape != want or T.from_numpy(dst.dtype) != t.dtype:
            raise TcArgumentError(f"out= for '{t.name}' must be {t.dtype} with shape {want}, got {dst.dtype} "
                                  f"with shape {dst.shape}", t.span.location())
        if isinstance(dst, np.ndarray) and not dst.flags.writeable:
            raise TcArgumentError(f"out= for '{t.name}' is read-only", t.span.location())
    return outs
