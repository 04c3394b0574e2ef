"""Input signatures: what a compiled function expects, and a check that names the input that is wrong.

A :class:`TensorSpec` is the plain-data form of a Relax tensor parameter: its name, dtype and
shape, where a dimension is an int (fixed), a string (a symbolic variable such as ``"n"``) or None
(an expression: any value). :func:`check` compares inputs (anything with ``shape`` and ``dtype``:
numpy arrays, TVM tensors) against specs and raises :class:`~byoc_hetero.errors.InputError`
naming the input, the expected and the given shape or dtype. A symbolic dimension accepts any
value (within its declared range, :func:`dim_ranges`, when the model declares one), but one
variable used twice must get the same value everywhere; the rank always has to match.

>>> check("main", signature(mod["main"]), [x])   # raises InputError naming the bad input
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from .errors import InputError

Dim = int | str | None


@dataclass(frozen=True)
class TensorSpec:
    """The expected dtype and shape of one tensor input."""

    name: str
    #: ``"float32"``...; None when the signature leaves the dtype open
    dtype: str | None
    #: one entry per dimension (int: fixed, str: a symbolic variable, None: any); None: any rank
    shape: tuple[Dim, ...] | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> TensorSpec:
        shape = data.get("shape")
        return TensorSpec(str(data["name"]), data.get("dtype"), None if shape is None else tuple(shape))

    def shape_text(self) -> str:
        if self.shape is None:
            return "any shape"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"


def tensor_spec(var: relax.Var) -> TensorSpec | None:
    """The spec of a Relax parameter; None when it is not a tensor (a tuple, a shape...)."""
    return type_spec(var.name, var.ty)


def type_spec(name: str, ty) -> TensorSpec | None:
    """The spec of a value named ``name`` of Relax type ``ty``; None when it is not a tensor."""
    if not isinstance(ty, relax.TensorType):
        return None
    dtype = str(ty.dtype) if ty.dtype is not None and str(ty.dtype) else None
    if ty.shape is not None and isinstance(ty.shape, relax.ShapeExpr):
        shape: tuple[Dim, ...] | None = tuple(_dim(d) for d in ty.shape.values)
    elif int(ty.ndim) >= 0:
        shape = (None,) * int(ty.ndim)
    else:
        shape = None
    return TensorSpec(name, dtype, shape)


def _dim(expr) -> Dim:
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tvm.tirx.Var):
        return str(expr.name)
    return None


DimRanges = Mapping[str, tuple[int | None, int | None]]
"""Declared ranges of symbolic dims: ``{"N": (1, 64)}``; None for an open end."""

LOWER_BOUND_ATTR, UPPER_BOUND_ATTR = "tir_var_lower_bound", "tir_var_upper_bound"
"""The function attributes holding the ranges: TVM's torch importer writes them from
``torch.export.Dim(min=, max=)`` (and TVM's memory planning reads the upper bounds);
:func:`byoc_hetero.from_onnx` writes them from ``dim_ranges``."""


def with_dim_ranges(func: relax.Function, ranges: DimRanges) -> relax.Function:
    """``func`` with ``ranges`` written as the bound attributes :func:`dim_ranges` reads (an open
    end is not written)."""
    lower = {n: lo for n, (lo, _) in ranges.items() if lo is not None}
    upper = {n: hi for n, (_, hi) in ranges.items() if hi is not None}
    if lower:
        func = func.with_attr(LOWER_BOUND_ATTR, lower)
    if upper:
        func = func.with_attr(UPPER_BOUND_ATTR, upper)
    return func


def dim_ranges(func: relax.Function) -> dict[str, tuple[int | None, int | None]]:
    """The declared range of each symbolic dim of ``func`` (:data:`DimRanges`); empty if none."""
    attrs = func.attrs if func.attrs is not None else {}
    ranges: dict[str, tuple[int | None, int | None]] = {}
    for key, side in ((LOWER_BOUND_ATTR, 0), (UPPER_BOUND_ATTR, 1)):
        if key in attrs:
            for name, value in attrs[key].items():
                lo_hi = list(ranges.get(str(name), (None, None)))
                lo_hi[side] = int(value)
                ranges[str(name)] = (lo_hi[0], lo_hi[1])
    return ranges


def range_text(lo: int | None, hi: int | None) -> str:
    """``[1, 64]``, ``[2, ...]``: a declared range as messages show it."""
    return f"[{'...' if lo is None else lo}, {'...' if hi is None else hi}]"


def signature(func: relax.Function, skip: Mapping[str, Any] | Sequence[str] | None = None) -> list[TensorSpec | None]:
    """The spec of each parameter of ``func`` whose name is not in ``skip`` (e.g. weights in ``params``)."""
    skipped = set(skip or ())
    return [tensor_spec(v) for v in func.params if v.name not in skipped]


def output_signature(func: relax.Function) -> list[TensorSpec | None]:
    """The spec of each output of ``func``, named ``output0``, ``output1``...: one for a tensor result,
    one per field of a tuple result (None for a field that is not a tensor)."""
    ty = func.ret_ty
    fields = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
    return [type_spec(f"output{i}", t) for i, t in enumerate(fields)]


def check_count(function: str, specs: Sequence[TensorSpec | None], count: int) -> None:
    """Raise :class:`InputError` when ``count`` inputs are given for ``specs``."""
    if count != len(specs):
        names = ", ".join(s.name if s is not None else "?" for s in specs)
        raise InputError(f"{function} takes {len(specs)} inputs ({names}), got {count}")


def check(function: str, specs: Sequence[TensorSpec | None], values: Sequence[Any],
          ranges: DimRanges | None = None) -> None:
    """Raise :class:`InputError` when ``values`` do not match ``specs`` (count, dtype, rank, dims)
    or give a symbolic dim a value outside its declared range (``ranges``, :func:`dim_ranges`).

    A spec of None (a non-tensor parameter) accepts anything; so does a value without ``shape``
    and ``dtype`` attributes (the callee reports it)."""
    ranges = ranges or {}
    check_count(function, specs, len(values))
    bound: dict[str, tuple[int, int, str]] = {}  # symbolic dim → (value, input index, input name)
    for i, (spec, value) in enumerate(zip(specs, values)):
        if spec is None or not (hasattr(value, "shape") and hasattr(value, "dtype")):
            continue
        where = f"{function}: input {i} ({spec.name!r})"
        dtype = str(value.dtype)
        if spec.dtype is not None and dtype != spec.dtype:
            raise InputError(f"{where}: expected dtype {spec.dtype}, got {dtype}")
        if spec.shape is None:
            continue
        got = [int(n) for n in value.shape]
        if len(got) != len(spec.shape) or any(isinstance(d, int) and d != n for d, n in zip(spec.shape, got)):
            raise InputError(f"{where}: expected shape {spec.shape_text()}, got {got}")
        for axis, (d, n) in enumerate(zip(spec.shape, got)):
            if not isinstance(d, str):
                continue
            if n < 0:  # 0 is an empty batch: the result is empty, as llvm and ONNX Runtime give it
                raise InputError(f"{where}: expected shape {spec.shape_text()} with {d} >= 0, got {got}")
            lo, hi = ranges.get(d, (None, None))
            if (lo is not None and n < lo) or (hi is not None and n > hi):
                raise InputError(f"{where}: dim {axis} ({d}) is {n}, outside its declared range "
                                 f"{range_text(lo, hi)} (shape {spec.shape_text()}, got {got})")
            if d in bound and bound[d][0] != n:
                first, j, other = bound[d]
                raise InputError(f"{where}: expected shape {spec.shape_text()} with {d} = {first} "
                                 f"(from input {j} ({other!r})), got {got}")
            bound.setdefault(d, (n, i, spec.name))


def check_inputs(mod: tvm.IRModule, inputs: Sequence[Any], params: Mapping[str, Any] | None = None,
                 entry: str = "main") -> None:
    """Raise :class:`InputError` naming the input when ``inputs`` do not match the signature of
    ``mod[entry]`` (its parameters not in ``params``)."""
    check(entry, signature(mod[entry], params), inputs, dim_ranges(mod[entry]))


def sample_lists(mod: tvm.IRModule, samples: Sequence[Any], params: Mapping[str, Any] | None = None,
                 what: str = "calibration") -> list[list[Any]]:
    """Sample inputs (each an array, a list of arrays in ``main``'s input order, or a dict by input
    name) as lists of numpy arrays in input order, each checked by :func:`check_inputs`; a dict
    missing an input is an :class:`InputError` naming it and ``what`` (``"calibration"``...)."""
    import numpy as np

    names = [p.name for p in mod["main"].params if not params or p.name not in params]
    out = []
    for k, sample in enumerate(samples):
        if isinstance(sample, Mapping):
            missing = [n for n in names if n not in sample]
            if missing:
                raise InputError(f"{what} input #{k} lacks {', '.join(missing)} (inputs: {', '.join(names)})")
            arrays = [np.asarray(sample[n]) for n in names]
        elif isinstance(sample, np.ndarray):
            arrays = [sample]
        else:
            arrays = [np.asarray(a) for a in sample]
        check_inputs(mod, arrays, params)
        out.append(arrays)
    return out
