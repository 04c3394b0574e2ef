"""The exception family of byoc_hetero.

Every error the package raises on purpose is a :class:`ByocError`; the subclass says which stage
of the flow (rules → stages → codegen → runtime) found the problem, and the message names the rule,
op, shape or dtype involved.
"""

from __future__ import annotations


class ByocError(Exception):
    """Base class of every error raised by byoc_hetero."""


class RuleError(ByocError, ValueError):
    """A rule is malformed: unknown target or op, a pattern that is not a pattern, a bad check."""


class CodegenError(ByocError):
    """A region cannot be serialized for the runtime (an op or attribute the runtime cannot run)."""


class InputError(ByocError, ValueError):
    """An input given to a compiled model does not match its signature (shape, dtype, count)."""


def _register_with_ffi() -> None:
    """Let the family cross TVM's FFI with its type: a rule's error raised inside a TVM pass (a
    pattern check, a Python module pass) would otherwise come back as a plain RuntimeError."""
    import tvm_ffi

    for cls in (ByocError, RuleError, CodegenError, InputError):
        tvm_ffi.register_error(cls)


_register_with_ffi()
