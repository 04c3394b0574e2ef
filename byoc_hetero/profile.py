"""Op profile: how many ops of each kind run where, at any point of the partition stages.

This is what the seed notebook's ``profile_graph`` printed for Relay, for Relax modules: ops in the
entry functions count for ``llvm`` (TVM compiles them); ops inside composite functions and regions
count for their target; after ``PartitionGraph`` the ops of each offloaded region are read back
from its runtime module's graph.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .codegen import region_graph_json

HOST = "llvm"


@dataclass
class OpProfile:
    """Op counts per target: ``counts[target][op] -> n``; plus composite and region counts."""

    counts: dict[str, Counter] = field(default_factory=dict)
    composites: Counter = field(default_factory=Counter)
    regions: Counter = field(default_factory=Counter)

    def add(self, target: str, op: str, n: int = 1) -> None:
        self.counts.setdefault(target, Counter())[op] += n

    def total(self, target: str | None = None) -> int:
        """Number of ops on ``target`` (all targets when None)."""
        if target is not None:
            return sum(self.counts.get(target, Counter()).values())
        return sum(sum(c.values()) for c in self.counts.values())

    def __str__(self) -> str:
        lines = []
        for target in sorted(self.counts, key=lambda t: (t != HOST, t)):
            ops = self.counts[target]
            extra = ""
            if target in self.regions or target in self.composites:
                extra = f", {self.composites[target]} composites, {self.regions[target]} regions"
            lines.append(f"{target}: {sum(ops.values())} ops{extra}")
            for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
                lines.append(f"    {op:<28} {n}")
        return "\n".join(lines)

    __repr__ = __str__


def _op_name(call: relax.Call) -> str | None:
    return call.op.name.removeprefix("relax.") if isinstance(call.op, tvm.ir.Op) else None


def _count_function(func: relax.Function, target: str, mod: tvm.IRModule, prof: OpProfile,
                    ext: dict[str, dict]) -> None:
    """Count the ops of ``func`` for ``target``, descending into called composites/regions."""
    local: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Function):
            return
        if not isinstance(expr, relax.Call):
            return
        op = _op_name(expr)
        if op == "call_dps_packed":
            symbol = str(expr.args[0].global_symbol)
            graph = ext.get(symbol)
            if graph is not None:
                source = graph.get("source", {})
                for name, n in source.get("ops", {}).items():
                    prof.add(graph["target"], name, n)
                prof.regions[graph["target"]] += 1
                prof.composites[graph["target"]] += len(source.get("composites", []))
                return
        if op is not None:
            if op not in ("call_tir", "call_dps_packed"):
                prof.add(target, op)
            return
        callee = None
        if isinstance(expr.op, relax.GlobalVar):
            callee = mod[expr.op]
        elif expr.op in local:
            callee = local[expr.op]
        if isinstance(callee, relax.Function):
            attrs = callee.attrs
            if attrs is not None and "Codegen" in attrs:
                tgt = str(attrs["Codegen"])
                prof.regions[tgt] += 1
                _count_function(callee, tgt, mod, prof, ext)
            elif attrs is not None and "Composite" in attrs:
                tgt = str(attrs["Composite"]).split(".", 1)[0]
                prof.composites[tgt] += 1
                _count_function(callee, tgt, mod, prof, ext)
            else:
                _count_function(callee, target, mod, prof, ext)

    def walk(body):
        for block in body.blocks:
            for binding in block.bindings:
                if isinstance(binding.value, relax.Function):
                    local[binding.var] = binding.value
                else:
                    relax.analysis.post_order_visit(binding.value, visit)

    if isinstance(func.body, relax.SeqExpr):
        walk(func.body)


def op_profile(mod: tvm.IRModule, entry: str = "main") -> OpProfile:
    """Count the ops of ``mod[entry]`` per target (``llvm`` for what TVM compiles itself).

    Example
    -------
    >>> print(bh.op_profile(m))
    llvm: 9 ops
        nn.max_pool2d                5
        ...
    byoc_hetero: 22 ops, 11 composites, 6 regions
        conv2d                       8
    """
    ext = {}
    for module in (mod.attrs["external_mods"] if mod.attrs and "external_mods" in mod.attrs else []):
        graph = region_graph_json(module)
        if graph is not None:
            graph["target"] = graph.get("source", {}).get("target", module.kind)
            ext[graph["symbol"]] = graph
    prof = OpProfile()
    _count_function(mod[entry], HOST, mod, prof, ext)
    return prof
