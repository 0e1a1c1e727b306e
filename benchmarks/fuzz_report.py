"""Fuzzer report: runs the strategies of tests/fuzz_defs.py for N examples without pytest and prints
the outcome counts (examples, errors by class, mismatches) and, per failure class, the shortest
source that showed it.

    python benchmarks/fuzz_report.py --examples 2000 --mode c --seed 1
    python benchmarks/fuzz_report.py --minutes 10 --mode all

Modes: ``numpy`` (valid defs on the interpreter), ``c`` (valid defs, C against the interpreter),
``mutant`` (damaged texts, interpreter), ``mutant-c`` (damaged texts, C against the interpreter),
``all`` (the four in turn, the time split between them). Compiled kernels go to a private
temporary cache.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import fuzz_defs as F  # noqa: E402

MODES = ("numpy", "c", "mutant", "mutant-c")


class TimeUp(Exception):
    """Ends a mode at its time limit (raised after every draw, so hypothesis sees no other change)."""




def failure_class(msg: str) -> str:
    """The first line of a failure with numbers, names and quoted text blanked, so one class of
    failure is counted once."""
    first = msg.splitlines()[0] if msg else ""
    first = re.sub(r"'[^']*'", "'_'", first)
    first = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", first)
    return first[:160]


def run(mode: str, examples: int, seconds: float, seed: int) -> tuple[Counter[str], dict[str, str], int]:
    outcomes: Counter[str] = Counter()
    failures: dict[str, str] = {}
    deadline = time.monotonic() + seconds
    count = 0

    def record(fn: Any) -> None:
        nonlocal count
        count += 1
        try:
            outcomes[fn()] += 1
        except F.FuzzFailure as e:
            cls = failure_class(str(e))
            outcomes["FAILURE " + cls] += 1
            if cls not in failures or len(str(e)) < len(failures[cls]):
                failures[cls] = str(e)

    opts = settings(max_examples=examples, deadline=None, database=None, derandomize=False, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    if mode in ("numpy", "c"):
        @opts
        @given(F.cases())
        def prop(case: F.Case) -> None:
            if time.monotonic() > deadline:
                raise TimeUp
            record(lambda: F.check_case(case, run_c=mode == "c"))
    else:
        @opts
        @given(F.mutants(), st.integers(0, 2**32 - 1))
        def prop(mutant: tuple[str, F.DefSpec], arg_seed: int) -> None:
            if time.monotonic() > deadline:
                raise TimeUp
            record(lambda: F.check_mutant(mutant[0], arg_seed, run_c=mode == "mutant-c"))

    import random

    random.seed(seed)
    prop._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    try:
        prop()
    except TimeUp:
        pass
    except Exception:  # noqa: BLE001 - a fault of the fuzzer itself: shown, and the counts so far kept
        traceback.print_exc()
    return outcomes, failures, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=1000, help="examples per mode (at most)")
    ap.add_argument("--minutes", type=float, default=60.0, help="time limit for all modes together")
    ap.add_argument("--mode", choices=(*MODES, "all"), default="all")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.environ["TCDSL_CACHE_DIR"] = tempfile.mkdtemp(prefix="tcdsl-fuzz-")
    os.environ.setdefault("TCDSL_SCHEDULE_TIMEOUT", "3")  # a stalled isl scheduler is reported, not waited on
    modes = MODES if a.mode == "all" else (a.mode,)
    total_fail = 0
    for mode in modes:
        t0 = time.monotonic()
        outcomes, failures, n = run(mode, a.examples, a.minutes * 60 / len(modes), a.seed)
        print(f"== mode {mode}: {n} examples in {time.monotonic() - t0:.0f} s")
        for outcome, k in sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {k:6d}  {outcome}")
        for cls, msg in failures.items():
            total_fail += 1
            print(f"\n-- failure: {cls}\n{msg}\n")
        for key, n in sorted(F.STATS.items()):
            print(f"  {n:6d}  {key}\n{F.WARNED.get(key[len('warning '):], '')}")
        F.STATS.clear()
        F.WARNED.clear()
        sys.stdout.flush()
    print(f"failure classes: {total_fail}")


if __name__ == "__main__":
    main()
