"""The ``tcdsl`` command line: ``tcdsl check FILE.tc`` prints each def checked, with its ranges.

Errors are printed located (file:line:col, the source line, a caret) with exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import TcError
from .grammar import parse
from .sema import check_def


def _check(args: argparse.Namespace) -> int:
    for path in args.files:
        text = Path(path).read_text(encoding="utf-8")
        module = parse(text, str(path))
        for d in module.defs:
            print(check_def(d))
            print()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tcdsl", description="Tensor comprehensions compiler.")
    sub = ap.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="print each def in canonical form with the inferred range of every index")
    check.add_argument("files", nargs="+", metavar="FILE.tc")
    check.set_defaults(run=_check)
    args = ap.parse_args(argv)
    try:
        return int(args.run(args))
    except TcError as e:
        print(f"tcdsl: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"tcdsl: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
