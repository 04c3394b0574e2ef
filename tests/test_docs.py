"""The documentation runs: every ```python block of README.md and docs/*.md, so the docs cannot go stale.

Each file's blocks run in order in one namespace (a later block may use what an earlier one defined),
in a fresh temporary directory (files the docs write land there; each block is saved there as a file
first, so that code reading its own source, as TVMScript does, works). Blocks fenced otherwise (```bash,
```text) are not run. A page may keep a block from running by fencing it ```text; a block that needs
an optional package (Ray, ...) is skipped when the page says so with a first line
``# needs: <module>`` and the module is missing.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
NEEDS = re.compile(r"^# needs: *([\w.]+)")


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python blocks of a Markdown text, in order."""
    return BLOCK.findall(text)


def test_block_extraction_takes_python_fences_only():
    text = "a\n```python\nx = 1\n```\n```bash\nrm -rf /\n```\n```text\nnot run\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]


def test_the_guide_has_its_pages():
    names = {p.name for p in PAGES}
    for page in ("README.md", "index.md", "rules-and-targets.md", "stages.md", "placement.md", "shapes.md",
                 "precisions.md", "cli.md", "runtime.md", "region-format.md", "relax-kernels.md", "serving.md"):
        assert page in names, page
    index = (ROOT / "docs" / "index.md").read_text()
    for page in names - {"README.md", "index.md"}:
        assert f"({page})" in index, f"docs/index.md does not link {page}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_python_blocks_run(page, tmp_path, monkeypatch, restore_rules):
    blocks = python_blocks(page.read_text())
    if not blocks:
        pytest.skip(f"{page.name} has no python blocks")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for i, block in enumerate(blocks):
        needs = NEEDS.match(block)
        if needs and importlib.util.find_spec(needs.group(1)) is None:
            pytest.skip(f"{page.name} block {i + 1} needs {needs.group(1)}")
        # a real file: TVMScript (``@T.prim_func``) reads its function's source through inspect
        source = tmp_path / f"{page.stem.replace('-', '_')}_block{i + 1}.py"
        source.write_text(block)
        exec(compile(block, str(source), "exec"), namespace)  # noqa: S102 - running the docs is the point
