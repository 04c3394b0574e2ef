"""List the import circles of byoc_hetero/ and the private names imported across its modules.

    python3 tools/import_circles.py [package-dir]

Exit status 1 when any is found (tests/test_house.py runs it). The graph is built statically with
``ast``: every ``import``/``from ... import`` counts, at module level and inside functions alike (an
import inside a function is still a dependency, only a later one); relative imports are resolved;
imports under ``if TYPE_CHECKING:`` are left out (they never run). ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module of the package — a ``.py``, a compiled extension beside
it, or one the ``CMakeLists.txt`` next to the package installs into it (a non-editable install
builds ``_C`` elsewhere: CI's checkout has no ``_C*.so``) — else to ``pkg`` itself. A circle is a
strongly connected component of two or more modules (or a module importing itself). A private
name is one that starts with ``_`` (not a dunder, not a module) imported from another module.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of ``source`` on ``target`` (module names)."""

    source: str
    target: str
    line: int
    names: tuple[str, ...]  # the names taken from ``target`` (empty for ``import target``)


def package_modules(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package`` (``__init__`` names the package)."""
    modules = {}
    for file in sorted(package.rglob("*.py")):
        parts = list(file.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = file
    for ext in package.rglob("*.so"):  # compiled extensions are modules too (never part of a circle)
        parts = list(ext.relative_to(package.parent).parts)
        modules.setdefault(".".join(parts[:-1] + [ext.name.split(".")[0]]), ext)
    for target, folder in _installed_extensions(package.parent / "CMakeLists.txt"):
        if folder.split("/")[0] == package.name:
            modules.setdefault(".".join(folder.split("/") + [target]), package / f"{target}.so")
    return modules


def _installed_extensions(cmake: Path) -> list[tuple[str, str]]:
    """(target, folder) of every ``install(TARGETS t LIBRARY DESTINATION folder)`` in ``cmake``."""
    if not cmake.is_file():
        return []
    pattern = r"install\(\s*TARGETS\s+(\w+)\s+LIBRARY\s+DESTINATION\s+([\w/]+)\s*\)"
    return re.findall(pattern, cmake.read_text())


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST):
    """Every import statement under ``node``, skipping the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import reads from."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imports(package: Path) -> list[Import]:
    """Every dependency between modules of ``package`` (imports of other packages are left out)."""
    modules = package_modules(package)
    found = []
    for module, file in modules.items():
        if file.suffix != ".py":
            continue
        is_package = file.name == "__init__.py"
        tree = ast.parse(file.read_text(), str(file))
        for node in _import_nodes(tree):
            if isinstance(node, ast.Import):
                found += [Import(module, a.name, node.lineno, ()) for a in node.names if a.name in modules]
                continue
            base = _base(module, is_package, node)
            taken = []
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.append(Import(module, f"{base}.{alias.name}", node.lineno, ()))
                else:
                    taken.append(alias.name)
            if taken and base in modules:
                found.append(Import(module, base, node.lineno, tuple(taken)))
    found += _parents(found, modules)
    return sorted({i for i in found if i.target != i.source or i.names}, key=lambda i: (i.source, i.line, i.target))


def _parents(found: list[Import], modules: dict[str, Path]) -> list[Import]:
    """Importing ``a.b.c`` runs ``a.b``'s ``__init__`` first: an edge to every package above the
    target that is not already above the importer (those are running when the importer does)."""
    more = []
    for i in found:
        above_source = {".".join(i.source.split(".")[:k]) for k in range(1, i.source.count(".") + 2)}
        parts = i.target.split(".")
        for k in range(1, len(parts)):
            parent = ".".join(parts[:k])
            if parent in modules and parent not in above_source:
                more.append(Import(i.source, parent, i.line, ()))
    return more


def circles(found: list[Import]) -> list[list[str]]:
    """The strongly connected components of the import graph with a circle in them, each sorted."""
    graph: dict[str, set[str]] = {}
    for i in found:
        graph.setdefault(i.source, set()).add(i.target)
        graph.setdefault(i.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit)
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(found: list[Import], package: Path) -> list[Import]:
    """The imports that take a private name (``_x``, not a dunder) from another module, unless
    that module lists the name in its ``__all__`` (``_native`` exports the extension ``_C`` so)."""
    exported = _exports(package)
    return [i for i in found if i.source != i.target
            and any(_private(n) and n not in exported.get(i.target, ()) for n in i.names)]


def _exports(package: Path) -> dict[str, set[str]]:
    """Module name -> the names of its literal ``__all__``."""
    exported = {}
    for module, file in package_modules(package).items():
        if file.suffix != ".py":
            continue
        for node in ast.parse(file.read_text(), str(file)).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                try:
                    exported[module] = set(ast.literal_eval(node.value))
                except ValueError:
                    pass
    return exported


def describe(found: list[Import], package: Path) -> list[str]:
    """One line per circle (its modules and the imports that close it) and per private import."""
    lines = []
    for component in circles(found):
        members = set(component)
        edges = [f"{i.source}:{i.line} -> {i.target}" for i in found
                 if i.source in members and i.target in members and i.source != i.target]
        lines.append(f"circle of {len(component)}: {', '.join(component)}\n    " + "\n    ".join(sorted(set(edges))))
    exported = _exports(package)
    for i in private_imports(found, package):
        private = [n for n in i.names if _private(n) and n not in exported.get(i.target, ())]
        lines.append(f"private import {i.source}:{i.line} takes {', '.join(private)} from {i.target}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", type=Path, default=ROOT / "byoc_hetero")
    args = parser.parse_args(argv)
    lines = describe(imports(args.package), args.package)
    print("\n".join(lines))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
