"""Offload backends, one package each (as TVM's ``python/tvm/relax/backend/<backend>/``).

A backend package registers its target, its rules (patterns and checks) and its codegen
(``relax.ext.<target>``) when it is imported. The generic machinery they use is
:mod:`byoc_hetero.rules` (what a backend can run) and :mod:`byoc_hetero.stages` (the passes).

* :mod:`.onednn`: target ``onednn`` (alias ``byoc_hetero``), regions run by this package's C++
  runtime on oneDNN.
* :mod:`.tvm_cpu`: target ``tvm_cpu`` (alias ``tvm-cpu``), regions compiled by TVM itself with
  parallel, vectorized CPU schedules (registered through ``register_target`` like a user's).
* :mod:`.cuda_vendor`: target ``cuda_vendor``, regions run on an NVIDIA GPU by cuBLASLt and cuDNN (its runtime
  library is built only with the CUDA headers of the ``[cuda]`` extra, and loads CUDA at first run).
"""

from . import cuda_vendor, onednn, tvm_cpu

__all__ = ["cuda_vendor", "onednn", "tvm_cpu"]
