"""The oneDNN backend's runtime modules, as the generic code reads them back.

The C++ runtime makes modules of kind :data:`RUNTIME_KIND` (``byoc_hetero``: the kind is the
name libraries exported earlier were saved with, so it stays); each can return its region graph
(docs/region-format.md). The backend object hands :func:`region_graph` to
:func:`byoc_hetero._relax.region_table`, which reports and placement use.
"""

from __future__ import annotations

import json
from typing import Any

import tvm

RUNTIME_KIND = "byoc_hetero"
"""The ``kind`` of the runtime modules the oneDNN backend's codegen creates."""


def region_graph(module: tvm.runtime.Module) -> dict[str, Any] | None:
    """The region graph of one of this runtime's modules, else None."""
    if module.kind != RUNTIME_KIND:
        return None
    return json.loads(module["get_graph_json"]())
