"""Named Relax rewrites, one module each (what it rewrites and why in its docstring).

The structure engineer owns the ordered pipeline list; until then each pass is hooked into the
import or partition step by a one-line call:

* :mod:`.bool_arith`   (import: ``from_torch``, ``from_onnx``) scans and max/min reductions of bool
  tensors rewritten into integer arithmetic that TVM's llvm codegen builds;
* :mod:`.repeat_broadcast` (partition, before the stages) documents the one runtime step a
  ``broadcast_to`` that repeats elements becomes (GQA's ``repeat_kv``);
* :mod:`.isnan_softmax` (partition, before the stages) reads the ONNX exporter's
  ``where(isnan(softmax), 0, softmax)`` as the safe softmax the torch path already has.
"""
