"""byoc_hetero: a bring-your-own-codegen plugin for Apache TVM (Relax) with oneDNN kernels.

Offload rules (:mod:`byoc_hetero.rules`) say which calls the ``onednn`` backend (a
:class:`Backend`; ``byoc_hetero`` is its earlier name, still accepted) or a backend of yours can run; the four classic partition stages (:func:`stages`) group those calls into
regions; the codegen turns each region into a module of the C++ oneDNN runtime; stock
``relax.build`` compiles the rest for llvm and links the regions in.

>>> import byoc_hetero as bh
>>> mod, params = bh.models.vgg11()
>>> m = bh.partition(mod, params)            # MergeComposite → ... → PartitionGraph
>>> ex = tvm.relax.build(m, target="llvm")
"""

# A source checkout first on sys.path (``python -m pytest`` from the repository root) holds no
# compiled ``_C``: let the package also look in the installed copy's folder for it.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from . import backends, codegen, models, passes, rules  # noqa: E402
from ._native import _C  # noqa: E402
from .errors import (
    ByocError,
    CodegenError,
    FrontendError,
    InputError,
    IntegrityError,
    ModelFileError,
    PlacementError,
    PlacementWarning,
    QuantizationError,
    RuleError,
    UnsupportedModelError,
)
from .frontends import from_onnx, from_torch
from .library import check_library, load_module
from .profile import OpProfile, op_profile
from .quant import QuantizedModel, quantize
from .report import PartitionReport, report
from .rules import (
    Backend,
    Match,
    op_rule,
    register_pattern,
    register_target,
    unregister_op_rule,
    unregister_pattern,
)
from . import llm, placement  # noqa: E402
from .tune import TuneReport, tune  # noqa: E402
from .backends.tvm_cpu.schedule import build, cpu_pipeline  # noqa: E402
from .placement import (  # noqa: E402,A004
    compile,
    place,
    placement_report,
    vm,
)
from .stages import (
    annotate_target,
    bind_params,
    merge_compiler_regions,
    merge_composite,
    partition,
    partition_graph,
    stages,
)

__version__ = _C.__version__

__all__ = [
    "Backend",
    "ByocError",
    "CodegenError",
    "FrontendError",
    "ModelFileError",
    "UnsupportedModelError",
    "from_onnx",
    "from_torch",
    "InputError",
    "IntegrityError",
    "llm",
    "Match",
    "OpProfile",
    "PlacementError",
    "PlacementWarning",
    "PartitionReport",
    "QuantizationError",
    "QuantizedModel",
    "RuleError",
    "annotate_target",
    "bind_params",
    "build",
    "check_library",
    "cpu_pipeline",
    "load_module",
    "merge_compiler_regions",
    "merge_composite",
    "models",
    "op_profile",
    "op_rule",
    "partition",
    "partition_graph",
    "passes",
    "place",
    "placement",
    "placement_report",
    "compile",
    "vm",
    "register_pattern",
    "register_target",
    "quantize",
    "report",
    "rules",
    "stages",
    "tune",
    "TuneReport",
    "unregister_op_rule",
    "unregister_pattern",
]
