"""Scalar types: TC type names, their numpy dtypes, and C's usual arithmetic conversions.

Used by semantic analysis (typing every expression) and by every backend (storage types).
"""

from __future__ import annotations

import functools

import numpy as np

# TC spelling -> canonical name; the canonical name is also the numpy dtype name.
ALIASES: dict[str, str] = {
    "bool": "bool",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "float32": "float32", "float": "float32",
    "float64": "float64", "double": "float64",
}
TYPE_NAMES = tuple(ALIASES)
CANONICAL = tuple(dict.fromkeys(ALIASES.values()))

INDEX = "int32"  # the type of index names and size symbols used as values
INT_LITERAL = "int32"
FLOAT_LITERAL = "float32"


def canonical(name: str) -> str:
    return ALIASES[name]


def np_dtype(name: str) -> np.dtype:
    return np.dtype(canonical(name))


@functools.lru_cache(maxsize=256)
def from_numpy(dt: np.dtype) -> str | None:
    """The canonical TC type of a numpy dtype (any byte order), or None if TC has no such type."""
    name = np.dtype(dt).newbyteorder("=").name
    return name if name in CANONICAL else None


def is_float(t: str) -> bool:
    return t.startswith("float")


def is_int(t: str) -> bool:
    return t.startswith("int") or t.startswith("uint")


def is_unsigned(t: str) -> bool:
    return t.startswith("uint")


def bits(t: str) -> int:
    return 8 if t == "bool" else int("".join(c for c in t if c.isdigit()))


def promote(a: str, b: str) -> str:
    """C's usual arithmetic conversions: floats win (wider float wins), then integer promotion."""
    if is_float(a) or is_float(b):
        fa = bits(a) if is_float(a) else 0
        fb = bits(b) if is_float(b) else 0
        return f"float{max(fa, fb)}"
    a, b = _int_promote(a), _int_promote(b)
    if a == b:
        return a
    if is_unsigned(a) == is_unsigned(b):
        return a if bits(a) >= bits(b) else b
    u, s = (a, b) if is_unsigned(a) else (b, a)
    if bits(u) >= bits(s):
        return u
    return s  # the signed type is wider, so it holds every value of the unsigned one


def _int_promote(t: str) -> str:
    return "int32" if t == "bool" or bits(t) < 32 else t


def float_of(t: str) -> str:
    """The floating type a math builtin computes in for an argument of type ``t``."""
    return t if is_float(t) else "float32"


def identity(op: str, t: str) -> int | float | bool:
    """The identity of a reduction operator (``+ * min max``) in type ``t``."""
    if op == "+":
        return 0
    if op == "*":
        return 1
    if t == "bool":
        return op == "min"
    if is_float(t):
        return float("inf") if op == "min" else float("-inf")
    info = np.iinfo(np.dtype(t))
    return int(info.max) if op == "min" else int(info.min)
