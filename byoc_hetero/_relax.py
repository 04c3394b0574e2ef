"""Shared facts about Relax modules and offloaded regions.

One place for the questions the rules, the stages, the report, the op profile and placement all
ask of a Relax module: a value's tensor type, static shape and dtype; the op a call calls; which
functions of a module are entry functions (not composites, not regions); which ops a module uses;
the offloaded regions a partitioned module carries (``external_mods``) and the runtime modules a
built library imports.

Everything here only reads IR or runtime modules, except :func:`updated`, which returns a changed
copy. The names are stable: other packages (placement) call them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .targets import backend_for_runtime, canonical_name

#: Function attributes TVM's BYOC passes use: a composite's rule name, a region's codegen.
COMPOSITE_ATTR = "Composite"
CODEGEN_ATTR = "Codegen"

#: Attribute of a composite function: the backend that will run it (set by AnnotateTarget).
TARGET_ATTR = "byoc_hetero.target"


# ----------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------
def tensor_type(value: relax.Expr | relax.TensorType | None) -> relax.TensorType | None:
    """The tensor type of an expression (or the type itself); None when it is not a tensor."""
    ty = value if isinstance(value, relax.TensorType) else getattr(value, "ty", None)
    return ty if isinstance(ty, relax.TensorType) else None


def static_shape(value: relax.Expr | relax.TensorType | None) -> tuple[int, ...] | None:
    """The shape of a tensor value (or tensor type) as ints; None when unknown or symbolic."""
    ty = tensor_type(value)
    if ty is None or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = []
    for d in ty.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        dims.append(int(d.value))
    return tuple(dims)


_DIM_OPS = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//"}


def dim_text(dim: Any) -> int | str | None:
    """A shape dim (a TIR expression) as an int, or as an expression in the region format's dim
    language (symbols, non-negative ints, ``+ - * //``, parentheses); None when it uses anything
    else (min, max, modulo, casts, a negative constant)."""
    if isinstance(dim, int):
        return dim
    if isinstance(dim, tvm.tirx.IntImm):
        return int(dim.value)
    if isinstance(dim, tvm.tirx.Var):
        name = str(dim.name)
        return name if name.isidentifier() else None
    op = _DIM_OPS.get(type(dim).__name__)
    if op is None:
        return None
    a, b = dim_text(dim.a), dim_text(dim.b)
    if a is None or b is None or (isinstance(a, int) and a < 0) or (isinstance(b, int) and b < 0):
        return None
    if isinstance(a, int) and isinstance(b, int):  # TVM folds these; kept exact if it did not
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b > 0 else None}[op]
    return f"({a} {op} {b})" if op in "+-" else f"{_atom(a)} {op} {_atom(b)}"


def _atom(text: int | str) -> str:
    """``text`` as an operand of ``*`` or ``//``: parenthesized unless a name or a number."""
    s = str(text)
    return s if s.isidentifier() or s.isdigit() or (s.startswith("(") and s.endswith(")")) else f"({s})"


def shape_of(value: relax.Expr | relax.TensorType | None) -> tuple[int | str, ...] | None:
    """The shape of a tensor value with symbolic dims as expressions (:func:`dim_text`); ints for
    static dims, so a static shape equals :func:`static_shape`. None when the rank is unknown or a
    dim cannot be written in the region format's dim language."""
    ty = tensor_type(value)
    if ty is None or ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = tuple(dim_text(d) for d in ty.shape.values)
    return None if any(d is None for d in dims) else dims


def shape_symbols(shape: tuple[int | str, ...] | None) -> list[str]:
    """The symbol names a :func:`shape_of` shape uses, in order."""
    import re

    names: list[str] = []
    for d in shape or ():
        if isinstance(d, str):
            names += [n for n in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", d) if n not in names]
    return names


def opaque_dims(boundary: Iterable[tuple[int | str, ...]], inside: Iterable[tuple[int | str, ...]]
                ) -> tuple[dict[str, str], str | None]:
    """Symbols a region's boundary cannot bind, replaced by opaque ones where that is exact.

    The runtime binds each symbol from a bare dim of a region input or output (docs/region-format.md,
    "Binding"). A region cut out of a flattened graph may see a symbol only inside an expression:
    ``[s77 * s27, 64] -> [s77 * s27, 64]`` around a dense (torch.export's BERT). When every dim of
    every tensor (``boundary`` and ``inside``) that uses such a symbol is one of the boundary's
    expressions, each of those expressions can stand as a symbol of its own: the result maps it
    to a fresh name (``s77_x_s27``), and the region computes the same thing at every size. Else
    the second item says why the region cannot run (its plans could not be made from its
    arguments' shapes); the map is then empty.
    """
    boundary, inside = list(boundary), list(inside)
    edge = {d for shape in boundary for d in shape if isinstance(d, str)}
    bare = {d for d in edge if d.isidentifier()}
    used = {s for shape in boundary + inside for s in shape_symbols(shape)}
    unbound = used - bare
    if not unbound:
        return {}, None
    exprs = {d for d in edge if not d.isidentifier() and set(shape_symbols((d,))) & unbound}
    for shape in boundary + inside:
        for d in shape:
            if isinstance(d, str) and set(shape_symbols((d,))) & unbound and d not in exprs:
                s = sorted(set(shape_symbols((d,))) & unbound)[0]
                seen = ", ".join(sorted(exprs)) or "no dim that uses it"
                return {}, (f"symbol {s} is no dim of its own of the region's inputs or outputs (they have "
                            f"{seen}), so the runtime cannot evaluate the dim {d} from their shapes")
    names: dict[str, str] = {}
    taken = set(used)
    for d in sorted(exprs):
        base = d.replace("//", " d ").replace("*", " x ").replace("+", " p ").replace("-", " m ")
        base = "_".join(base.replace("(", " ").replace(")", " ").split())
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        names[d] = name
    return names, None


def tensor_dtype(value: relax.Expr | relax.TensorType | None) -> str:
    """The dtype of a tensor value (or tensor type) as a string; ``""`` when it is not a tensor."""
    ty = tensor_type(value)
    return str(ty.dtype) if ty is not None else ""


def describe(value: relax.Expr) -> str:
    """A short human description of a value: ``float32[1, 3, 224, 224]`` (else its class name)."""
    ty = tensor_type(value)
    if ty is None:
        return type(value).__name__
    shape = shape_of(ty)
    dims = ", ".join(str(d) for d in shape) if shape is not None else str(ty.shape)
    return f"{ty.dtype}[{dims}]"


# ----------------------------------------------------------------------------------------------
# Calls and functions
# ----------------------------------------------------------------------------------------------
def op_name(call: relax.Call) -> str | None:
    """The full name of the Op a call calls (``relax.nn.conv2d``); None when it calls a function."""
    op = getattr(call, "op", None)
    return op.name if isinstance(op, tvm.ir.Op) else None


def short_op_name(name: str) -> str:
    """An op name without the ``relax.`` prefix (``nn.conv2d``), as profiles and reports print it."""
    return name.removeprefix("relax.")


def op_calls(expr: relax.Expr) -> list[relax.Call]:
    """Every call of an Op inside ``expr`` (a function or its body), in post order."""
    calls: list[relax.Call] = []

    def visit(e: relax.Expr) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            calls.append(e)

    relax.analysis.post_order_visit(expr.body if isinstance(expr, relax.Function) else expr, visit)
    return calls


def is_composite(func: Any) -> bool:
    """Whether ``func`` is a composite function (made by a pattern or op rule)."""
    attrs = getattr(func, "attrs", None)
    return isinstance(func, relax.Function) and attrs is not None and COMPOSITE_ATTR in attrs


def is_region(func: Any) -> bool:
    """Whether ``func`` is an outlined region (a function with a ``Codegen`` attribute)."""
    attrs = getattr(func, "attrs", None)
    return isinstance(func, relax.Function) and attrs is not None and CODEGEN_ATTR in attrs


def is_composite_or_region(func: Any) -> bool:
    """Whether ``func`` is a composite function or an outlined region."""
    return is_composite(func) or is_region(func)


def composite_name(func: relax.Function) -> str | None:
    """The rule name of a composite function (``byoc_hetero.conv2d_bias_relu``), else None."""
    return str(func.attrs[COMPOSITE_ATTR]) if is_composite(func) else None


def composite_target(func: relax.Function) -> str | None:
    """The target of a composite function (the prefix of its ``Composite`` name), else None."""
    name = composite_name(func)
    return name.split(".", 1)[0] if name is not None else None


def region_target(func: relax.Function) -> str | None:
    """The target (codegen) of an outlined region, else None."""
    return str(func.attrs[CODEGEN_ATTR]) if is_region(func) else None


def entry_functions(mod: tvm.IRModule, skip_attrs: Iterable[str] = ()) -> list[str]:
    """Names of the Relax functions of ``mod`` that the passes work on.

    These are the functions that are neither composites nor regions, and carry none of
    ``skip_attrs`` (placement skips the loaders of its device constants this way).
    """
    skip = tuple(skip_attrs)
    names = []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or is_composite_or_region(func):
            continue
        if skip and func.attrs is not None and any(a in func.attrs for a in skip):
            continue
        names.append(gv.name_hint)
    return names


def ops_in(mod: tvm.IRModule) -> set[str]:
    """Names of the ops called anywhere in ``mod``'s Relax functions."""
    ops: set[str] = set()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            ops.update(op_name(c) for c in op_calls(func))
    return ops


def local_functions(func: relax.Function) -> dict[relax.Var, relax.Function]:
    """The functions bound inside ``func``'s top-level body (a region binds its composites so)."""
    found = {}
    if isinstance(func.body, relax.SeqExpr):
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding.value, relax.Function):
                    found[binding.var] = binding.value
    return found


def bound_values(func: relax.Function) -> dict[relax.Var, relax.Expr]:
    """Each variable bound in ``func``'s top-level body → its value (to follow a dataflow chain
    back from an argument to the call that made it)."""
    if not isinstance(func.body, relax.SeqExpr):
        return {}
    return {b.var: b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b, relax.VarBinding)}


def called_function(mod: tvm.IRModule, call: relax.Call,
                    local: Mapping[relax.Var, relax.Function] | None = None) -> relax.Function | None:
    """The Relax function a call calls: a global function of ``mod``, or one of ``local``
    (:func:`local_functions` of the caller); None for an op call or anything else."""
    op = call.op
    if isinstance(op, relax.GlobalVar):
        func = mod[op]
    elif local is not None and isinstance(op, relax.Var):
        func = local.get(op)
    else:
        func = None
    return func if isinstance(func, relax.Function) else None


def region_composites(region: relax.Function) -> list[relax.Function]:
    """The composite functions a region calls, one entry per call site, in order."""
    local: dict[relax.Var, relax.Function] = {}
    called = []
    for block in region.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Function):
                local[binding.var] = value
            elif isinstance(value, relax.Call) and value.op in local:
                called.append(local[value.op])
    return called


def alias_of(value: relax.Expr, lookup: Callable[[relax.Expr], Any]) -> tuple[bool, Any]:
    """What a binding that computes nothing stands for, in a codegen's terms: ``(True, lookup(v))``
    for a variable, a tuple of lookups for a tuple, the item of the looked-up tuple for a tuple
    item; ``(False, None)`` for any other value."""
    if isinstance(value, relax.Var):
        return True, lookup(value)
    if isinstance(value, relax.Tuple):
        return True, tuple(lookup(f) for f in value.fields)
    if isinstance(value, relax.TupleGetItem):
        return True, lookup(value.tuple_value)[value.index]
    return False, None


def function_outputs(func: relax.Function) -> list[relax.Expr]:
    """The values a function returns: the fields of a returned tuple, else the one value."""
    out = func.body.body if isinstance(func.body, relax.SeqExpr) else func.body
    return list(out.fields) if isinstance(out, relax.Tuple) else [out]


def updated(mod: tvm.IRModule, functions: Mapping[tvm.ir.GlobalVar, Any] | None = None,
            remove: Iterable[tvm.ir.GlobalVar] = ()) -> tvm.IRModule:
    """A copy of ``mod`` with ``functions`` replaced or added and ``remove`` deleted.

    IRModules are shared between passes, so a pass never assigns into the module it was given.
    """
    mod = mod.clone()
    for gv, func in (functions or {}).items():
        mod[gv] = func
    for gv in remove:
        del mod[gv]
    return mod


# ----------------------------------------------------------------------------------------------
# Offloaded regions of a partitioned module, runtime modules of a built one
# ----------------------------------------------------------------------------------------------
def external_modules(mod: tvm.IRModule) -> list[tvm.runtime.Module]:
    """The runtime modules RunCodegen attached to ``mod`` (its ``external_mods`` attribute)."""
    attrs = mod.attrs
    if attrs is None or "external_mods" not in attrs:
        return []
    return list(attrs["external_mods"])


def document_tensor_text(tensor: Mapping[str, Any]) -> str:
    """A region document's tensor as ``dtype[d0, d1, ...]`` (for reports)."""
    return f"{tensor['dtype']}[{', '.join(str(d) for d in tensor['shape'])}]"


def region_graph_json(module: tvm.runtime.Module) -> dict[str, Any] | None:
    """The region document of a runtime module made by a backend's codegen (for the oneDNN backend
    the graph of docs/region-format.md), asked of the backend whose ``runtime_kind`` the module
    has; None for any other module."""
    backend = backend_for_runtime(str(module.kind))
    if backend is None or backend.region_graph is None:
        return None
    return backend.region_graph(module)


@dataclass(frozen=True)
class RegionEntry:
    """One offloaded region of a partitioned module, as the region table describes it."""

    symbol: str
    target: str
    module: tvm.runtime.Module = field(repr=False)
    #: the region graph (docs/region-format.md); None for a module of another runtime
    graph: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def ops(self) -> Counter:
        """Relax op counts the region was made of, by short name (``nn.conv2d``)."""
        return Counter((self.graph or {}).get("source", {}).get("ops", {}))

    @property
    def relax_ops(self) -> tuple[str, ...]:
        """Full names of the Relax ops the region was made of (``relax.nn.conv2d``)."""
        return tuple(n if n.startswith("relax.") else "relax." + n for n in self.ops)

    @property
    def composites(self) -> list[str]:
        """The composite (rule) names merged into the region, one per call site."""
        return list((self.graph or {}).get("source", {}).get("composites", []))


def region_table(mod: tvm.IRModule) -> dict[str, RegionEntry]:
    """The regions carried by a partitioned module whose backend can describe them, by external
    symbol (:func:`region_graph_json`)."""
    table = {}
    for module in external_modules(mod):
        graph = region_graph_json(module)
        if graph is not None:
            # a library built before the oneDNN backend was renamed says "byoc_hetero" here
            target = canonical_name(str(graph.get("source", {}).get("target", module.kind)))
            table[str(graph["symbol"])] = RegionEntry(str(graph["symbol"]), target, module, graph)
    return table


def external_module_for(mod: tvm.IRModule, symbol: str) -> tvm.runtime.Module | None:
    """The external module of ``mod`` (of any runtime) that implements ``symbol``, else None."""
    for module in external_modules(mod):
        try:
            if module.implements_function(symbol):
                return module
        except Exception:  # noqa: BLE001 - a module that cannot answer does not implement it
            continue
    return None


def imported_modules(module: tvm.runtime.Module) -> Iterator[tvm.runtime.Module]:
    """``module`` and every module it imports, transitively, each once."""
    stack, seen = [module], set()
    while stack:
        m = stack.pop()
        handle = m.__chandle__()
        if handle in seen:
            continue
        seen.add(handle)
        yield m
        stack.extend(m.imports)


def runtime_kinds(module: tvm.runtime.Module) -> set[str]:
    """Kinds of a runtime module and of everything it imports (``llvm``, ``cuda``, ``byoc_hetero``
    for the oneDNN backend's runtime)."""
    return {str(m.kind) for m in imported_modules(module)}


def region_modules(executable: Any) -> list[tvm.runtime.Module]:
    """The region runtime modules (of any backend with a ``runtime_kind``) a
    ``relax.VirtualMachine`` on ``executable`` runs.

    They are found among the imports of ``executable.jit()`` (what the VM loads, possibly a
    reloaded copy), not of the module the executable was built from; ``executable`` may also be a
    runtime module (a loaded library: ``bh.load_module``).
    """
    root = executable.jit() if isinstance(executable, tvm.runtime.Executable) else executable
    return [m for m in imported_modules(root) if backend_for_runtime(str(m.kind)) is not None]


def tensor_view(tensor: Any) -> np.ndarray:
    """A read-only numpy array over a CPU tensor's memory (no copy: a pass or the codegen reading a
    model's weights does not double them, issue 36's build peak); a copy where the tensor cannot be
    viewed so (a dtype numpy does not know). Read-only: a write through it raises instead of
    changing the constant."""
    try:
        view = np.from_dlpack(tensor)
    except (TypeError, ValueError, BufferError, RuntimeError):
        return tensor.numpy()
    view.flags.writeable = False
    return view


def constant_value(expr: Any) -> Any:
    """The value of a Relax constant (``GenericConst`` or ``Constant``) as a numpy array, else None."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, tvm.ir.Constant) and hasattr(expr, "data"):
        return expr.data.numpy()
    return None


def is_per_channel(shape: tuple[int, ...], out_shape: tuple[int, ...], channel_axis: int) -> bool:
    """Whether an operand of ``shape`` holds one value per channel of ``out_shape`` (broadcast)."""
    if len(shape) > len(out_shape):
        return False
    aligned = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    axis = channel_axis % len(out_shape)
    return all(dim == (out_shape[axis] if i == axis else 1) for i, dim in enumerate(aligned))
