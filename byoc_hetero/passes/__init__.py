"""Named Relax rewrites, one module each (what it rewrites and why in its docstring).

The structure engineer owns the ordered pipeline list; until then each pass is hooked into the
import or partition step by a one-line call:

* :mod:`.bool_arith` (import: ``from_torch``, ``from_onnx``): scans and max / min reductions of bool
  tensors as integer arithmetic that TVM's llvm codegen builds.
"""
