"""List the Python functions of byoc_hetero/ longer than a limit (default 80 lines).

    python3 tools/long_functions.py [--limit 80] [paths...]

Exit status 1 when any is found (tests/test_passes.py runs it). A function's length is from its
``def`` (or first decorator) to its last line, docstring and nested functions included.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def long_functions(paths: list[Path], limit: int = 80) -> list[tuple[str, str, int]]:
    """``(file:line, qualified name, lines)`` for every function longer than ``limit`` lines."""
    found = []
    for path in paths:
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            tree = ast.parse(file.read_text(), str(file))
            found += _visit(tree, file, "", limit)
    return found


def _visit(node: ast.AST, file: Path, prefix: str, limit: int) -> list[tuple[str, str, int]]:
    found = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                length = child.end_lineno - start + 1
                if length > limit:
                    found.append((f"{file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}:{start}",
                                  name, length))
            found += _visit(child, file, name + ".", limit)
        else:
            found += _visit(child, file, prefix, limit)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("paths", nargs="*", type=Path, default=[ROOT / "byoc_hetero"])
    args = parser.parse_args(argv)
    found = long_functions(args.paths, args.limit)
    for where, name, length in sorted(found, key=lambda f: -f[2]):
        print(f"{where}: {name} is {length} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
