"""The exception family of byoc_hetero.

Every error the package raises on purpose is a :class:`ByocError`; the subclass says which part of
the flow (rules → stages → codegen → placement → runtime, or the model and inputs given to it)
found the problem, and the message names the rule, op, device, shape or dtype involved::

    ByocError
    ├── RuleError               a malformed offload rule
    ├── CodegenError            a region the runtime cannot run
    ├── InputError              inputs that do not match a compiled model's signature
    ├── FrontendError           a model that cannot be imported
    │   ├── ModelFileError      missing, unreadable or invalid model file
    │   ├── UnsupportedModelError   TVM's importer cannot translate it
    │   └── QuantizationError   malformed quantization parameters, or a quantizer option
    ├── PlacementError          a placement that cannot be honoured
    └── IntegrityError          a damaged artifact: an exported library cut short, a region
                                document or constant whose digest does not match

:class:`PlacementWarning` (a ``UserWarning``) flags a placement rule that had no effect.

The classes that report bad *values* given by the caller (:class:`RuleError`, :class:`InputError`,
:class:`FrontendError`, :class:`PlacementError`) also derive from ``ValueError`` so that code
written as ``except ValueError`` keeps working. Code that must tell our errors from TVM's (the
command line's exit codes) catches these classes, never ``ValueError``: TVM raises ``ValueError``
for its own failures too.
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


tvm_ffi.register_error(ByocError)


class RuleError(ByocError, ValueError):
    """A rule is malformed: unknown target or op, a pattern that is not a pattern, a bad check."""


class CodegenError(ByocError):
    """A region cannot be serialized for the runtime (an op or attribute the runtime cannot run)."""


class InputError(ByocError, ValueError):
    """An input given to a compiled model does not match its signature (count, shape, dtype), or an
    input file cannot be read."""


class FrontendError(ByocError, ValueError):
    """A model cannot be imported (base of :class:`ModelFileError` and :class:`UnsupportedModelError`)."""


class ModelFileError(FrontendError):
    """The model file is missing, unreadable or not a valid model."""


class UnsupportedModelError(FrontendError):
    """TVM's importer cannot translate the model (e.g. an op it does not know)."""


class QuantizationError(FrontendError):
    """A quantized model's parameters are malformed (a scale that is zero, negative, NaN or infinite;
    a zero point outside its type's range; a scale or zero point whose shape does not fit its
    tensor), or :func:`byoc_hetero.quantize` was given options or calibration data it cannot use.
    The message names the node (or bound variable), the input and the value."""


class PlacementError(ByocError, ValueError):
    """A placement cannot be honoured: a bad placement map, an unknown or undeclared device, an op
    whose operands and output are not on one device, a kernel compiled for the wrong target, a
    missing GPU module. The message names the op (or rule) and the devices involved."""


class IntegrityError(ByocError, ValueError):
    """A compiled artifact is damaged: a library file whose structure does not fit its size (cut
    short, overwritten), a region document or a region constant whose digest differs from the one
    written at export. The message names the file or the region (and constant)."""


class PlacementWarning(UserWarning):
    """A placement map entry that had no effect (e.g. it names an op the model does not contain)."""


def first_line(err: BaseException) -> str:
    """The line of an exception's message worth showing: its first non-empty line, or the last one
    when the message starts with a traceback (TVM's errors do); the class name when it is empty."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    return lines[-1] if "Traceback" in lines[0] else lines[0]
