"""The package's layers run one way: every import of a tcdsl module points down the pipeline
(core <- grammar <- polyhedral <- codegen <- the top: compiler, runtimes, tuner, autodiff, torch,
API, command line), no function hides an import of tcdsl's own modules (except the few that load
an optional dependency), and the modules import each other without a cycle.

Read from the sources with ``ast``, nothing is imported."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (folder, package), bottom layer first: a module may import its own layer and those below it.
# The folders are mapped to packages as in pyproject.toml's package-dir.
LAYERS = [("core", "tcdsl.core"), ("grammar", "tcdsl.grammar"), ("polyhedral", "tcdsl.polyhedral"),
          ("codegen", "tcdsl.codegen"), ("tcdsl", "tcdsl")]

# The only own modules a function may import: they import an optional dependency at their top,
# so they load on first use, and ``import tcdsl`` works without it.
LAZY = {
    "tcdsl.torch_ops": "imports torch",
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    path: Path
    line: int
    target: str  # the imported module (a package stands for its __init__)
    local: bool  # inside a function
    typing: bool  # under ``if TYPE_CHECKING:``: no import at run time


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in LAYERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def layer(module: str) -> int:
    """The index in LAYERS of a tcdsl module's layer: the longest listed package that holds it."""
    holders = [i for i, (_, package) in enumerate(LAYERS) if module == package or module.startswith(package + ".")]
    return max(holders, key=lambda i: len(LAYERS[i][1]))


def imports(module: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """Every import of a tcdsl module in ``path``: absolute (``tcdsl.x``) and relative ones, at the
    module's top and inside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names if a.name == "tcdsl" or a.name.startswith("tcdsl.")]
        if node.level:
            base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base != "tcdsl" and not base.startswith("tcdsl."):
            return []
        # ``from pkg import name``: the submodule when ``name`` is one, else ``pkg`` itself
        return sorted({f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names})

    def visit(node: ast.AST, local: bool, typing: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend(Import(module, path, child.lineno, t, local, typing) for t in targets(child))
            in_function = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            guarded = typing or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            visit(child, in_function, guarded)

    visit(tree, False, False)
    return found


def all_imports() -> list[Import]:
    known = modules()
    return [i for m, p in known.items() for i in imports(m, p, known)]


def where(i: Import) -> str:
    return f"{i.path.relative_to(ROOT)}:{i.line}: {i.source} imports {i.target}"


def fail_on(bad: list[str], what: str) -> None:
    if bad:
        pytest.fail(f"{what}:\n" + "\n".join(bad), pytrace=False)


def test_every_import_resolves_to_a_module_of_the_package() -> None:
    known = modules()
    fail_on([where(i) for i in all_imports() if i.target not in known], "imports of tcdsl modules that do not exist")


def test_imports_point_down_the_pipeline() -> None:
    names = [f"{folder}/" for folder, _ in LAYERS]
    bad = [f"{where(i)} ({names[layer(i.source)]} may not import {names[layer(i.target)]}, a layer above it)"
           for i in all_imports() if layer(i.target) > layer(i.source)]
    fail_on(bad, "imports that point up the pipeline")


def test_no_function_imports_tcdsl_modules() -> None:
    fail_on([where(i) for i in all_imports() if i.local and i.target not in LAZY],
            "function-local imports of tcdsl's own modules (import at the top: a cycle is broken by moving the "
            "shared piece down or passing it in; only modules of an optional dependency, listed in LAZY, load "
            "on first use)")


def test_no_import_cycle() -> None:
    """Over every import that runs (at the top or in a function; ``TYPE_CHECKING`` ones do not)."""
    graph: dict[str, list[Import]] = {}
    for i in all_imports():
        if not i.typing and i.target != i.source:
            graph.setdefault(i.source, []).append(i)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[Import] = []

    def cycle_from(m: str) -> list[Import] | None:
        state[m] = 1
        for i in graph.get(m, []):
            if state.get(i.target) == 1:  # back on the path: the cycle runs from there to here
                start = next(k for k, p in enumerate(path) if p.source == i.target)
                return [*path[start:], i]
            if i.target not in state:
                path.append(i)
                found = cycle_from(i.target)
                if found:
                    return found
                path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            fail_on([where(i) for i in cycle_from(m) or []], "import cycle")


def test_the_layers_cover_every_folder_of_the_package() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for folder, package in LAYERS:
        assert f'"{package}" = "{folder}"' in text, f"pyproject.toml maps no folder {folder}/ to {package}"
