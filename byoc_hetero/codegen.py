"""Where the runtime modules of a built library are (kept for callers of ``byoc_hetero.codegen``).

The codegen itself lives in the oneDNN backend (:mod:`byoc_hetero.backends.onednn.codegen`); the
queries over runtime modules live in :mod:`byoc_hetero._relax`.
"""

from ._relax import region_graph_json, region_modules

__all__ = ["region_graph_json", "region_modules"]
