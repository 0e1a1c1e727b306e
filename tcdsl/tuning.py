"""The tuning cache in the open: ``TuningCache -> list[Entry]``, what past searches stored, listed,
forgotten, exported to JSON and imported on another machine (``tc.tuning``; ``tcdsl cache`` on the
command line).

An entry is the best options one search found for a def (its text with names canonicalised), the
shapes, dtypes and strides of its arguments, a backend, and the machine: device, CPU target,
compiler and tcdsl's version. Calls use the entries made for this machine (``Entry.here``); an
imported file's entries for other machines are kept, listed and exported again, but not used.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.errors import TcArgumentError, TcError
from .core.options import MappingOptions
from .core.version import __version__
from .tuner import space as S
from .tuner import tune
from .tuner.cache import TuneEntry, TuneKey, TuningCache

FORMAT = "tcdsl-tuning"  # the "format" field of an export file
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Entry:
    """One stored result: the def's name, backend and arguments, the options and their time."""

    name: str
    backend: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    options: MappingOptions
    time_s: float
    created: float  # seconds since the epoch
    evaluations: int
    here: bool  # made for this machine (device, CPU target, compiler, tcdsl version): calls use it
    key: TuneKey

    def __str__(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.created))
        shapes = " ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        changed = ", ".join(self.options.changes()) or "the defaults"
        where = "" if self.here else f"  [other machine: {self.key.device}, {self.key.arch}]"
        return (f"{self.name} ({self.backend}) {shapes}: {self.time_s * 1e3:.4g} ms, {self.evaluations} candidates, "
                f"{when} UTC; {changed}{where}")


def _here(key: TuneKey, machines: dict[str, tuple[str, str, str] | None]) -> bool:
    if key.backend not in machines:
        try:
            machines[key.backend] = tune.device_for(key.backend)
        except (TcError, OSError, ImportError):
            machines[key.backend] = None  # no such device here: nothing of that backend runs
    mine = machines[key.backend]
    return mine is not None and (key.device, key.arch, key.compiler) == mine and key.version == __version__


def _entries(raw: Iterable[TuneEntry]) -> list[Entry]:
    machines: dict[str, tuple[str, str, str] | None] = {}
    return [Entry(e.key.entry, e.key.backend, e.key.shapes, e.key.dtypes, MappingOptions.from_json(e.options),
                  e.time_s, e.created, e.evaluations, _here(e.key, machines), e.key) for e in raw]


def _matches(key: TuneKey, which: Any, backend: str | None) -> bool:
    if backend is not None and key.backend != backend:
        return False
    if which is None:
        return True
    if isinstance(which, str):
        return key.entry == which
    checked = getattr(which, "checked", None)
    if checked is None:
        raise TcArgumentError(f"select entries by a kernel or a def name, not {type(which).__name__}")
    return key.entry == checked.name and key.tc == S.canonical_text(checked)


def entries(which: Any = None, *, backend: str | None = None, path: str | Path | None = None) -> list[Entry]:
    """The stored results, oldest first: all of them, or those of a def (``which``: a kernel, or a
    def's name) and/or a backend. ``path``: another tuning cache file than ``$TCDSL_TUNING_DB``."""
    return [e for e in _entries(TuningCache(path).entries()) if _matches(e.key, which, backend)]


def forget(which: Any = None, *, backend: str | None = None, path: str | Path | None = None) -> int:
    """Delete the stored results of a def (a kernel, or a def's name) and/or a backend, with their
    histories and checkpoints; returns how many. Selecting nothing is refused: ``clear()`` empties
    the cache."""
    if which is None and backend is None:
        raise TcArgumentError("forget() needs a def (a kernel or its name) or a backend; clear() forgets everything")
    cache = TuningCache(path)
    gone = [e.key for e in cache.entries() if _matches(e.key, which, backend)]
    for key in gone:
        cache.forget(key)
    return len(gone)


def clear(path: str | Path | None = None) -> int:
    """Delete every stored result; returns how many."""
    cache = TuningCache(path)
    keys = [e.key for e in cache.entries()]
    for key in keys:
        cache.forget(key)
    return len(keys)


def export(to: str | Path, which: Any = None, *, backend: str | None = None, path: str | Path | None = None) -> int:
    """Write the stored results (all, or those of a def and/or backend) to the JSON file ``to``,
    whole or not at all; returns how many. ``import_`` loads it on any machine."""
    chosen = [e for e in TuningCache(path).entries() if _matches(e.key, which, backend)]
    doc = {"format": FORMAT, "version": FORMAT_VERSION, "tcdsl": __version__,
           "entries": [{"key": json.loads(e.key.to_json()), "options": json.loads(e.options), "time_s": e.time_s,
                        "created": e.created, "evaluations": e.evaluations} for e in chosen]}
    target = Path(to)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(target)
    return len(chosen)


def import_(source: str | Path, *, path: str | Path | None = None) -> int:
    """Load a file ``export`` wrote into the tuning cache: each entry becomes the best for its key
    unless the cache holds a faster one; returns how many did. The file is checked whole first, so a
    bad file changes nothing."""
    where = str(source)
    try:
        doc = json.loads(Path(source).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TcArgumentError(f"{where}: not a tuning export ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
        raise TcArgumentError(f"{where}: not a tuning export (no \"format\": \"{FORMAT}\" with a list of entries)")
    if doc.get("version") != FORMAT_VERSION:
        raise TcArgumentError(f"{where}: export format version {doc.get('version')!r}; this tcdsl reads "
                              f"{FORMAT_VERSION}")
    rows = []
    for i, item in enumerate(doc["entries"]):
        try:
            key = TuneKey(**item["key"])
            options = MappingOptions.from_json(json.dumps(item["options"]))
            rows.append((key, options.to_json(), float(item["time_s"]), int(item.get("evaluations", 0))))
        except (KeyError, TypeError, ValueError, TcError) as e:
            raise TcArgumentError(f"{where}: entry {i}: {e}") from None
    cache = TuningCache(path)
    return sum(cache.record(key, options, time_s, evaluations) for key, options, time_s, evaluations in rows)
