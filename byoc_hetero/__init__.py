"""byoc_hetero: a bring-your-own-codegen plugin for Apache TVM (Relax) with oneDNN kernels."""

from ._native import _C

__version__ = _C.__version__
