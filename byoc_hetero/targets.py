"""Offload backends (targets): what each can run, how it lowers, which options and variants it has.

A :class:`Backend` is one object per offload target: its name (and aliases), its pattern rules, the
guard of its op-attribute rules, its codegen, its lowering table and region-graph passes in run
order, the options a partition may give it, and the implementation variants it can offer per op
(what a tuner enumerates). The oneDNN backend (:mod:`byoc_hetero.backends.onednn`) is one instance,
named ``onednn``; a user's backend is made the same way with :func:`register_target`.

Nothing in the generic code names a particular backend: the stages ask :func:`default_target` for
the backend used when none is given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax

from .errors import RuleError

if TYPE_CHECKING:  # only for annotations: patterns.py imports this module
    from .rules.patterns import PatternRule


@dataclass(frozen=True)
class Tunable:
    """How a tuner (``bh.tune``'s option level) may choose an option's value, per region.

    ``values``: the values it tries (the option's default among them, or added first);
    ``tolerance``: None where every value computes what the default does (the choice changes speed
    only); else the largest relative error against the default that the backend states for a value
    other than the default (e.g. a polynomial exp: 2e-6). Such a value is tried only where
    ``bh.tune`` is given a ``tolerance`` at least this large, and kept only where the region's
    outputs, measured against the default's on the same inputs, stay within ``bh.tune``'s tolerance.
    """

    values: tuple[Any, ...] = (False, True)
    tolerance: float | None = None

    @property
    def changes_numerics(self) -> bool:
        """Whether a value other than the default may compute other numbers."""
        return self.tolerance is not None


@dataclass(frozen=True)
class Option:
    """An option a backend accepts (``precision``, ``dim_ranges``, ...).

    ``check(value)`` returns the value to hand the codegen (normalized) or raises
    :class:`~byoc_hetero.RuleError` saying what was expected; ``default`` is what the backend does
    when the option is not given (the stages leave a default out of the codegen's options).
    ``tune``: where given, a tuner may choose the option's value per region (:class:`Tunable`);
    the option then also accepts a per-region table, ``{region key: value}`` (a mapping or its
    JSON text), each value checked by ``check``, which the codegen reads with
    :meth:`Backend.region_option` (a region the table does not name gets the default).
    """

    name: str
    doc: str
    default: Any = None
    check: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)
    tune: Tunable | None = field(default=None, compare=False)

    def checked(self, value: Any) -> Any:
        """``value`` as ``check`` normalizes it (itself without a check)."""
        return self.check(value) if self.check is not None else value


def region_table(value: Any) -> dict[str, Any] | None:
    """A per-region table of a tunable option (a mapping, or JSON text of an object) as a dict;
    None for a plain value (a JSON object that does not parse is a :class:`RuleError`)."""
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return None
    try:
        table = json.loads(value)
    except json.JSONDecodeError as err:
        raise RuleError(f"a per-region option table must be a JSON object, got {value[:60]!r}: {err}") from err
    return {str(k): v for k, v in table.items()}


@dataclass(frozen=True)
class Variant:
    """One implementation a backend can offer for an op (``conv2d``: ``direct``, ``winograd``, ...).

    ``selected_by`` says how the variant is chosen today (an option value or an environment
    variable of the runtime); ``applies`` says when it can run at all. A tuner enumerates
    :meth:`Backend.variants_for` and times each.
    """

    op: str
    name: str
    doc: str
    selected_by: str = ""
    applies: str = "always"
    level: str = ""  # the tuning level that chooses among the op's variants of this level ("algorithm", ...)
    #: how a tuner's choice of it reaches the node: ``"option"`` (the level's knob option) or
    #: ``"quantize"`` (quantize / dequantize steps around the layer, written by the tuner's quantizer)
    applied: str = "option"
    #: for a variant applied by quantizing: the kinds of the quantizer's layers (``Layer.op`` of
    #: :func:`~byoc_hetero.quantize`'s plan: ``"conv2d"``, ``"matmul"``) whose node in this backend's
    #: regions is this op (a tuner matches each layer to a node of one of these kinds)
    layers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Knob:
    """A decision a backend lets a tuner take (``bh.tune``): the backend owns its keys and says how
    a decision is applied; the tuner's level of the same name measures and chooses.

    ``level``: the tuning level (``"algorithm"``, ``"precision"``, ``"threads"``); ``option``: the
    backend option that applies the decisions (JSON ``{unit key: choice}``); ``op``: the op whose
    :class:`Variant` s of this level are the choices. Hooks, each optional:

    * ``units(graph)``: the units of one region document (e.g. its convolution sites); each has
      ``key()`` (its key in ``option``), ``timing_parts()`` (``(op, shapes, dtypes, attrs)``, what
      its timing depends on) and a readable ``str``;
    * ``probe(unit, choice)``: the unit alone with ``choice``, ready to call (what is timed), or
      None where the choice does not apply; ``default(unit)``: what the backend picks undecided;
      ``fixed(unit)``: why the unit keeps the default without being built ("" when it is tuned);
    * ``keys(symbol, graph)``: the key of each node of region ``symbol`` (its document ``graph``)
      for per-node decisions, None for a node that takes none; a key starts with ``symbol#`` and
      should name the node by what it computes, not its place, so that it survives passes that
      differ between the partition a tuner measured and the one it applies to;
      ``locate(key, graph)`` its inverse (the node's index in ``graph``, None where no node has it);
      ``node_reason(nodes, index)``: why that node takes no decision (None when it does);
      ``native(choice)``: why ``choice`` runs as another on this machine ("" when it runs as asked).
    """

    level: str
    option: str
    op: str = ""
    units: Callable[[Mapping[str, Any]], Any] | None = field(default=None, repr=False, compare=False)
    probe: Callable[[Any, str], Callable[[], object] | None] | None = field(default=None, repr=False, compare=False)
    default: Callable[[Any], str] | None = field(default=None, repr=False, compare=False)
    fixed: Callable[[Any], str] | None = field(default=None, repr=False, compare=False)
    keys: Callable[[str, Any], list[str | None]] | None = field(default=None, repr=False, compare=False)
    locate: Callable[[str, Any], int | None] | None = field(default=None, repr=False, compare=False)
    node_reason: Callable[[Any, int], str | None] | None = field(default=None, repr=False, compare=False)
    native: Callable[[str], str] | None = field(default=None, repr=False, compare=False)


@dataclass
class Backend:
    """An offload target (a backend).

    Parameters
    ----------
    name: composites are ``<name>.<rule>``, regions get ``Codegen=<name>``, PartitionGraph calls
        ``relax.ext.<name>``.
    can_lower: guard for op-attribute rules: ``can_lower(call)`` returns None when the codegen can
        run a single call of that op, else the reason (the call then stays with TVM).
    patterns: the pattern rules (filled by :func:`~byoc_hetero.register_pattern`).
    aliases: other names accepted wherever a target name is (``target=``, rule targets, the op
        attribute ``target.<alias>``, ``relax.ext.<alias>``, report keys).
    options: the options a partition may pass (``bh.partition(..., options={...})``); any other
        raises :class:`~byoc_hetero.RuleError` naming the option and the backend.
    variants: the implementations per op (:class:`Variant`).
    knobs: the decisions a tuner may take for its regions, by level (:class:`Knob`).
    lowering: the backend's lowering table (for the oneDNN backend,
        :class:`byoc_hetero.backends.onednn.table.LoweringTable`), None for a backend whose
        codegen is a plain function.
    region_passes: names of the region-graph passes, in run order (see :meth:`graph_passes`).
    runtime_kind: the ``kind`` of the runtime modules its codegen makes; ``region_graph(module)``
        reads one module's region document back (what reports and placement show), or None.
    device: the device kind its regions run on (``"cpu"``, or ``"cuda"`` for the cuda_vendor backend):
        placement keeps a region of a ``cpu`` backend on a CPU device and one of a ``cuda``
        backend on a GPU device.
    """

    name: str
    can_lower: Callable[[relax.Call], str | None] | None = field(default=None, repr=False)
    patterns: list["PatternRule"] = field(default_factory=list, repr=False)
    aliases: tuple[str, ...] = ()
    options: dict[str, Option] = field(default_factory=dict, repr=False)
    variants: dict[str, tuple[Variant, ...]] = field(default_factory=dict, repr=False)
    knobs: dict[str, Knob] = field(default_factory=dict, repr=False)
    lowering: Any = field(default=None, repr=False)
    region_passes: tuple[str, ...] = ()
    runtime_kind: str | None = None
    region_graph: Callable[[tvm.runtime.Module], dict | None] | None = field(default=None, repr=False)
    device: str = "cpu"

    @property
    def names(self) -> tuple[str, ...]:
        """The name and its aliases."""
        return (self.name, *self.aliases)

    def check_options(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """``options`` validated and normalized for the codegen; RuleError for an unknown one."""
        out = {}
        for key, value in (options or {}).items():
            opt = self.options.get(key)
            if opt is None:
                known = ", ".join(sorted(self.options)) or "none"
                raise RuleError(f"backend {self.name!r} has no option {key!r} (its options: {known})")
            table = region_table(value) if opt.tune is not None else None
            if table is not None:
                out[key] = json.dumps({k: opt.checked(v) for k, v in table.items()}, sort_keys=True)
            else:
                out[key] = opt.checked(value)
        return out

    def tunable_options(self) -> dict[str, Option]:
        """The options a tuner may choose per region (those with a :class:`Tunable`), by name."""
        return {name: opt for name, opt in self.options.items() if opt.tune is not None}

    def region_option(self, options: Mapping[str, Any] | None, name: str, region_key: str) -> Any:
        """The value of option ``name`` for the region keyed ``region_key`` (``cost_gate.region_key``)
        in ``options`` as a codegen is given them: a per-region table's entry, a plain value, or the
        option's default where neither names it."""
        opt = self.options[name]
        value = (options or {}).get(name)
        if value is None:
            return opt.default
        if not isinstance(value, (bool, int, float, Mapping)):
            value = str(value)  # an FFI string
        table = region_table(value) if opt.tune is not None else None
        if table is None:
            return opt.checked(value)
        return opt.checked(table[region_key]) if region_key in table else opt.default

    def variants_for(self, op: str) -> tuple[Variant, ...]:
        """The implementation variants the backend offers for ``op`` (short name, ``conv2d``)."""
        return self.variants.get(op, ())

    def choices(self, level: str, op: str) -> tuple[str, ...]:
        """The names of ``op``'s variants that the tuning level ``level`` chooses among."""
        return tuple(v.name for v in self.variants_for(op) if v.level == level)

    def level_ops(self, level: str) -> tuple[str, ...]:
        """The ops that have variants of the tuning level ``level`` (e.g. the node kinds whose
        precision a tuner may choose)."""
        return tuple(op for op, vs in self.variants.items() if any(v.level == level for v in vs))

    def applied_by(self, level: str, how: str) -> tuple[str, ...]:
        """The names of the variants of ``level`` (any op) applied ``how`` (:attr:`Variant.applied`:
        ``"option"`` or ``"quantize"``), in declaration order."""
        names = (v.name for vs in self.variants.values() for v in vs if v.level == level and v.applied == how)
        return tuple(dict.fromkeys(names))

    def quantized_layers(self, level: str) -> dict[str, tuple[str, ...]]:
        """Op -> the quantizer's layer kinds whose node it is (:attr:`Variant.layers`), for each op
        with a variant of ``level`` applied by quantizing."""
        return {op: tuple(dict.fromkeys(k for v in vs if v.level == level and v.applied == "quantize"
                                        for k in v.layers))
                for op, vs in self.variants.items() if any(v.level == level and v.applied == "quantize" for v in vs)}

    def graph_passes(self) -> list[tuple[str, Callable[[Any], None]]]:
        """The region-graph passes of the lowering table as ``(name, fn)``, in run order.

        The order is :attr:`region_passes`; a pass registered by an op module but not listed there
        runs after them, in registration order (``tests/test_passes.py`` requires every pass to be
        listed, so a new one gets its place on purpose).
        """
        if self.lowering is None:
            return []
        registered = dict(self.lowering.graph_passes_by_name())
        missing = [n for n in self.region_passes if n not in registered]
        if missing:
            raise RuleError(f"backend {self.name!r} lists region passes no op module registers: {missing}")
        listed = [(n, registered[n]) for n in self.region_passes]
        return listed + [(n, f) for n, f in registered.items() if n not in self.region_passes]


Target = Backend
"""The earlier name of :class:`Backend`."""

_TARGETS: dict[str, Backend] = {}
_ALIASES: dict[str, str] = {}
_DEFAULT: list[str] = []

Codegen = Callable[[Any, Any, Any], list]
"""``codegen(funcs, options, constant_names) -> list[tvm.runtime.Module]`` (what RunCodegen calls)."""


def canonical_name(name: str) -> str:
    """The backend name ``name`` stands for (itself unless it is an alias)."""
    return _ALIASES.get(name, name)


def register_target(
    name: str,
    can_lower: Callable[[relax.Call], str | None] | None = None,
    codegen: str | Codegen | None = None,
    **fields: Any,
) -> Backend:
    """Declare an offload target (backend). Registering an existing name returns it, updating what
    is given.

    Parameters
    ----------
    name: the target (backend) name (or an alias of a registered one).
    can_lower: optional guard for op-attribute rules (None = can run, else the reason).
    codegen: the codegen of the target's regions: a function ``(funcs, options, constant_names)
        -> list[Module]`` registered as ``relax.ext.<name>``, or the name of an existing target
        whose codegen to reuse (e.g. ``"onednn"`` to run this target's regions on the oneDNN
        runtime too). Without one, PartitionGraph needs ``relax.ext.<name>`` registered elsewhere.
    fields: further :class:`Backend` fields (``aliases``, ``options``, ``variants``, ``knobs``, ``lowering``,
        ``region_passes``, ``runtime_kind``, ``region_graph``, ``device``).
    """
    if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
        raise RuleError(f"target name must be a non-empty identifier, got {name!r}")
    unknown = set(fields) - set(Backend.__dataclass_fields__) - {"name", "patterns"}
    if unknown:
        raise RuleError(f"register_target({name!r}): unknown backend fields {sorted(unknown)}")
    name = canonical_name(name)
    tgt = _TARGETS.get(name)
    if tgt is None:
        tgt = _TARGETS[name] = Backend(name, can_lower)
    elif can_lower is not None:
        tgt.can_lower = can_lower
    for key, value in fields.items():
        setattr(tgt, key, tuple(value) if key in ("aliases", "region_passes") else value)
    for alias in tgt.aliases:
        if alias in _TARGETS and alias != name:
            raise RuleError(f"alias {alias!r} of backend {name!r} is a backend of its own")
        _ALIASES[alias] = name
    if codegen is not None:
        for each in tgt.names:
            _register_codegen(each, codegen)
    return tgt


def _register_codegen(name: str, codegen: str | Codegen) -> None:
    if isinstance(codegen, str):
        if canonical_name(codegen) == canonical_name(name):
            raise RuleError(f"target {name!r} cannot reuse its own codegen")
        impl = tvm.get_global_func(f"relax.ext.{codegen}", allow_missing=True)
        if impl is None:
            raise RuleError(f"target {name!r}: no codegen relax.ext.{codegen} to reuse")
    elif callable(codegen):
        impl = codegen
    else:
        raise RuleError(f"target {name!r}: codegen must be a target name or a function")
    tvm.register_global_func(f"relax.ext.{name}", impl, override=True)


def get_target(name: str) -> Backend:
    """The registered target ``name`` (or alias); RuleError listing the known targets otherwise."""
    tgt = _TARGETS.get(canonical_name(name))
    if tgt is None:
        raise RuleError(f"unknown offload target {name!r}; registered targets: {sorted(_TARGETS)}")
    return tgt


get_backend = get_target


def declared_target(name: str, what: str) -> Backend:
    """The target ``name`` that a rule (``what``) is registered for; RuleError unless it was declared.

    Rules for a target nobody declared used to be accepted silently, and the partition then failed
    inside TVM (``Codegen is not found: relax.ext.<name>``): declaring the target first is where its
    codegen is given, so a rule cannot name a target that has none."""
    tgt = _TARGETS.get(canonical_name(name))
    if tgt is None:
        raise RuleError(f"{what}: target {name!r} is not declared; call bh.register_target({name!r}, "
                        f"codegen=...) first (registered targets: {sorted(_TARGETS)})")
    return tgt


def require_codegens(mod: tvm.IRModule) -> None:
    """RuleError unless every region of ``mod`` (a function with TVM's ``Codegen`` attribute) has its
    codegen ``relax.ext.<name>`` registered: called before RunCodegen, which would fail with TVM's
    own ``InternalError: Codegen is not found``."""
    names = {str(f.attrs["Codegen"]) for _, f in mod.functions_items()
             if isinstance(f, relax.Function) and f.attrs is not None and "Codegen" in f.attrs}
    for name in sorted(names):
        if tvm.get_global_func(f"relax.ext.{name}", allow_missing=True) is None:
            raise RuleError(f"target {name!r} has no codegen: give one with bh.register_target({name!r}, "
                            f"codegen=my_codegen), or codegen='onednn' to run its regions on the "
                            "oneDNN runtime")


def targets() -> list[str]:
    """Names of the registered targets."""
    return sorted(_TARGETS)


def set_default_target(name: str) -> None:
    """Make ``name`` the target used when a stage is given none (the oneDNN backend does, at import)."""
    _DEFAULT[:] = [get_target(name).name]


def default_target() -> str:
    """The target the stages use when given none."""
    if not _DEFAULT:
        raise RuleError("no default offload target is registered; pass target=")
    return _DEFAULT[0]


def backend_for_runtime(kind: str) -> Backend | None:
    """The backend whose codegen makes runtime modules of ``kind``, else None."""
    return next((b for b in _TARGETS.values() if b.runtime_kind == kind), None)
