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
    return [create_module(lower_region(func, constant_names, precision, ranges, others)) for func in funcs]
