"""House rules checked on the code itself (issue 38): no import circles in byoc_hetero/, no private
name taken across its modules (tools/import_circles.py), and no C++ function of cpp/ over 80 lines
(tools/long_functions_cpp.py), beside the Python length rule of tests/test_passes.py."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_no_import_circles_and_no_private_imports():
    """Every import counts (function-level ones too: a later dependency is still one); printed so a
    failure shows each circle with the imports that close it."""
    tool = _tool("import_circles")
    lines = tool.describe(tool.imports(ROOT / "byoc_hetero"), ROOT / "byoc_hetero")
    print("\n".join(lines))
    assert lines == []


def test_import_rule_holds_on_a_checkout_without_the_built_extension(tmp_path):
    """CI installs the wheel (``pip install .``): its checkout has no ``byoc_hetero/_C*.so``, so
    ``from . import _C`` must still read as the extension module CMakeLists.txt installs there, not
    as a name of the package (session 8's CI failed on exactly that: a circle of 27 modules)."""
    import shutil

    shutil.copytree(ROOT / "byoc_hetero", tmp_path / "byoc_hetero", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "CMakeLists.txt", tmp_path / "CMakeLists.txt")
    tool = _tool("import_circles")
    assert tool.describe(tool.imports(tmp_path / "byoc_hetero"), tmp_path / "byoc_hetero") == []
    (tmp_path / "CMakeLists.txt").write_text("")  # without the install rule the same tree is a circle
    assert tool.describe(tool.imports(tmp_path / "byoc_hetero"), tmp_path / "byoc_hetero") != []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "pkg"


def test_import_rule_finds_circles_through_functions_packages_and_private_names(tmp_path):
    """The rule on a made-up package: a circle closed by a function-level relative import, one
    through a package ``__init__`` (importing ``sub.b`` runs ``sub/__init__``), a private name taken
    across modules; a ``TYPE_CHECKING`` import and a private name listed in ``__all__`` are not."""
    tool = _tool("import_circles")
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import f\n",
        "b.py": "def f():\n    from . import a\n    return a\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\nfrom .sub.leaf import g\n",
        "d.py": "from .c import g\n",
        "sub/__init__.py": "from .leaf import g\nfrom .e import h\n",
        "sub/leaf.py": "def g():\n    return 1\n",
        "sub/e.py": "def h():\n    from ..x import _hidden, _shared\n    return _hidden, _shared\n",
        "x.py": "__all__ = ['_shared']\n_hidden = 1\n_shared = 2\nfrom .sub.leaf import g\n",
    })
    found = tool.imports(pkg)
    assert tool.circles(found) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.e", "pkg.x"]]
    assert [(i.source, i.target) for i in tool.private_imports(found, pkg)] == [("pkg.sub.e", "pkg.x")]
    lines = tool.describe(found, pkg)
    assert lines[0].startswith("circle of 2: pkg.a, pkg.b") and "pkg.b:2 -> pkg.a" in lines[0]
    assert lines[-1] == "private import pkg.sub.e:2 takes _hidden from pkg.x"


def _doc_table(heading: str) -> list[list[str]]:
    """The rows (cells, backticks stripped) of the first table under ``heading`` in docs/backends.md."""
    text = (ROOT / "docs" / "backends.md").read_text()
    assert heading in text, f"docs/backends.md lost its section {heading!r}"
    rows = []
    for line in text[text.index(heading):].splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip().replace("\\|", "|") for c in line.replace("\\|", "\x00").strip("|").split("|")]
            rows.append([c.replace("\x00", "|").strip("`") for c in cells])
        elif rows and not line.startswith("|"):
            break
    return rows[1:]  # the header row left out


def test_backends_doc_lists_every_option_and_variant_of_the_onednn_backend():
    """docs/backends.md's two tables against what the onednn backend declares: the same options
    (with their defaults) and the same variants (op, name, how each is selected), no more, no less."""
    import byoc_hetero as bh

    backend = bh.rules.get_target("onednn")
    options = {row[0]: row[1] for row in _doc_table("### Every option of the `onednn` backend")}
    assert options == {name: "none" if o.default is None else str(o.default) for name, o in backend.options.items()}
    variants = {(row[0], row[1]): row[3] for row in _doc_table("### Every variant of the `onednn` backend")}
    declared = {(op, v.name): v for op, vs in backend.variants.items() for v in vs}
    assert set(variants) == set(declared)
    for key, selected_by in variants.items():  # the doc's words for it name what the code names
        assert selected_by.replace("`", "").split(" ")[0] == declared[key].selected_by.split(" ")[0], key


def test_no_cpp_function_over_80_lines():
    """House rule (issue 38): no C++ function of cpp/ over 80 lines, as tests/test_passes.py asks of
    the Python; a file in the tool's KNOWN list (named, with why) is reported but allowed."""
    tool = _tool("long_functions_cpp")
    found = [f for f in tool.long_functions([ROOT / "cpp"], 80) if f[0].rpartition(":")[0] not in tool.KNOWN]
    assert found == []
    assert tool.long_functions([ROOT / "cpp"], 40)  # it does find long ones


def test_cpp_length_rule_counts_functions_not_classes_or_literals(tmp_path):
    """The scan on a made-up file: a free function, a member defined out of class, a constructor
    with an initializer list and a PYBIND11_MODULE-like macro are functions (from the name's line
    to the closing brace, nested lambdas and blocks inside); namespaces, classes, initializers and
    braces inside strings or comments are not."""
    tool = _tool("long_functions_cpp")
    source = tmp_path / "x.cc"
    source.write_text(textwrap.dedent('''\
        namespace a {
        struct S {
          int v;
          S(int x) : v(x) {
            if (x) { v = 2; }
          }
          int Get() const override { return v; }
        };
        static const int kTable[] = {1, 2, 3};
        int Free(int x,
                 int y) {
          auto f = [&](int z) { return z + 1; };  // a "}" in a comment
          const char* s = "{{{";
          return f(x) + y;
        }
        }  // namespace a
        void a::S::Other() const {
        }
        MODULE(_C, m) {
          m.def("x", []() { return 1; });
        }
        '''))
    assert tool.functions(source) == [("S", 4, 6), ("Get", 7, 7), ("Free", 10, 15), ("a::S::Other", 17, 18),
                                      ("MODULE", 19, 21)]
    assert tool.long_functions([source], 5) == [(str(source) + ":10", "Free", 6)]


def _inheritance(text: str) -> list[str]:
    """What makes parts share state instead of owning it: each ``protected:`` section and each class
    or struct with a base (``class A : public B``), with comments taken out first."""
    import re

    code = re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)  # lines kept
    found = [f"protected section at line {code[:m.start()].count(chr(10)) + 1}"
             for m in re.finditer(r"\bprotected\s*:", code)]
    found += [f"{m.group(1)} derives from {m.group(2).strip()}"
              for m in re.finditer(r"(?<!enum )\b(?:class|struct)\s+(\w+)(?:\s+final)?\s*:\s*(?!:)([^{;]*)\{", code)]
    return found


def test_planner_is_parts_it_owns():
    """House rule (issue 38): the planner is composition, not a chain of base classes sharing
    protected state: no class of cpp/planner.* or cpp/plan/ derives from another or has a
    protected section (the Planner owns its parts; each holds references to those it needs)."""
    files = [ROOT / "cpp" / "planner.h", ROOT / "cpp" / "planner.cc", *sorted((ROOT / "cpp" / "plan").glob("*.[hc]*"))]
    found = {str(f.relative_to(ROOT)): _inheritance(f.read_text()) for f in files}
    assert {f: what for f, what in found.items() if what} == {}
    # the check finds both on a made-up chain, and passes plain members and initializer lists
    chain = "class A {\n protected:\n  int x_;\n};\n// class C : public A {\nclass B final : public A {\n};\n"
    assert _inheritance(chain) == ["protected section at line 2", "B derives from public A"]
    plain = "enum class E : int { kA };\nclass P {\n public:\n  P(int x) : x_(x) {}\n private:\n  int x_;\n};\n"
    assert _inheritance(plain) == []
