"""The exception family of byoc_hetero.

Every error the package raises on purpose is a :class:`ByocError`; the subclass says which stage
of the flow (rules → stages → codegen → runtime) found the problem, and the message names the rule,
op, shape or dtype involved.
"""

from __future__ import annotations

import tvm_ffi


class ByocError(Exception):
    """Base class of every error raised by byoc_hetero.

    The class and every subclass are registered with TVM's FFI, so an error raised inside a TVM
    pass (a rule's check, a Python module pass) reaches the caller with its own type instead of
    TVM's plain RuntimeError.
    """

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        tvm_ffi.register_error(cls)


class RuleError(ByocError, ValueError):
    """A rule is malformed: unknown target or op, a pattern that is not a pattern, a bad check."""


class CodegenError(ByocError):
    """A region cannot be serialized for the runtime (an op or attribute the runtime cannot run)."""


class InputError(ByocError, ValueError):
    """An input given to a compiled model does not match its signature (shape, dtype, count)."""


tvm_ffi.register_error(ByocError)
