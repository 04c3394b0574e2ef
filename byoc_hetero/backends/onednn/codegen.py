"""The codegen entry of backend ``onednn``: each region → one module of the C++ runtime.

``RunCodegen`` calls the global ``relax.ext.onednn(funcs, options, constant_names)`` (also
registered as ``relax.ext.byoc_hetero``, the backend's earlier name) with the
outlined regions. Each is lowered (:mod:`.lowering`) to the JSON graph of ``docs/region-format.md``
and handed to the runtime's ``byoc_hetero.runtime.create``. Constants bound inside a region become
named constants: TVM's const loader gives them to the module once (``__init_<symbol>``), where the
runtime reorders the weights into oneDNN's preferred layout.
"""

from __future__ import annotations

import json
from typing import Any

import tvm

from .lowering import RegionGraph, lower_region
from .precision import DEFAULT_PRECISION


def create_module(graph: RegionGraph) -> tvm.runtime.Module:
    """Build the runtime module of one region (parses, validates, creates oneDNN primitives)."""
    return tvm.get_global_func("byoc_hetero.runtime.create")(graph.to_json())


def relax_ext_codegen(funcs, options, constant_names):
    """Entry point RunCodegen calls: one runtime module per region (registered by the backend
    object as ``relax.ext.onednn`` and ``relax.ext.byoc_hetero``).

    ``options`` (RunCodegen's target options for ``onednn``, checked by the backend's options) may hold ``precision``
    (``"f32"`` | ``"bf16"``), written into every region graph, and ``dim_ranges`` (JSON: the
    declared range of each symbol), written into the regions that have those symbols; the other
    options (``algorithms``) reach the region passes as ``graph.options``.
    """
    precision = str(options["precision"]) if options is not None and "precision" in options else DEFAULT_PRECISION
    # declared ranges of the symbolic dims ({"N": [1, 64]}, byoc_hetero/ranges.py codegen_options)
    ranges = json.loads(str(options["dim_ranges"])) if options is not None and "dim_ranges" in options else {}
    others = {str(k): v for k, v in (options or {}).items() if str(k) not in ("precision", "dim_ranges")}
    # threads per region (bh.tune's threads level), by region key: written as the document's "threads"
    from ...passes.retarget_regions import region_key_of

    threads = json.loads(str(others["region_threads"])) if "region_threads" in others else {}
    modules = []
    for func in funcs:
        graph = lower_region(func, constant_names, precision, ranges, others)
        graph.threads = int(threads.get(region_key_of(func), 0)) if threads else 0
        modules.append(create_module(graph))
    return modules


def check_region_threads(value: Any) -> str:
    """Validate the ``region_threads`` option: JSON ``{region key: threads >= 1}``."""
    from ...errors import RuleError

    try:
        table = json.loads(str(value))
    except json.JSONDecodeError as err:
        raise RuleError(f"option region_threads of backend 'onednn' must be JSON, got {str(value)[:60]!r}: {err}") from err
    if not isinstance(table, dict) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                              for n in table.values()):
        raise RuleError(f"option region_threads of backend 'onednn' must be a JSON object of region key -> "
                        f"threads (an integer >= 1), got {str(value)[:80]!r}")
    return json.dumps(table, sort_keys=True)
