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

from ._relax import (
    called_function,
    composite_target,
    local_functions,
    op_name,
    region_table,
    region_target,
    short_op_name,
)
from .ranges import is_range_check
from .targets import canonical_name

HOST = "llvm"


class _AliasKeys:
    """Keyed by backend name, also answering to a backend's aliases (``counts["byoc_hetero"]`` is
    ``counts["onednn"]``: the oneDNN backend's earlier name keeps working)."""

    def __contains__(self, key: object) -> bool:
        return super().__contains__(canonical_name(key) if isinstance(key, str) else key)

    def __missing__(self, key):
        real = canonical_name(key) if isinstance(key, str) else key
        if real != key and super().__contains__(real):
            return self[real]
        return self._absent(key)

    def get(self, key, default=None):
        return self[key] if key in self else default


class TargetCounter(_AliasKeys, Counter):
    """A Counter by target name (aliases accepted)."""

    def _absent(self, _key):
        return 0


class TargetDict(_AliasKeys, dict):
    """A dict by target name (aliases accepted)."""

    def _absent(self, key):
        raise KeyError(key)


@dataclass
class OpProfile:
    """Op counts per target: ``counts[target][op] -> n``; plus composite and region counts."""

    counts: dict[str, Counter] = field(default_factory=TargetDict)
    composites: Counter = field(default_factory=TargetCounter)
    regions: Counter = field(default_factory=TargetCounter)

    def add(self, target: str, op: str, n: int = 1) -> None:
        self.counts.setdefault(canonical_name(target), Counter())[op] += n

    def total(self, target: str | None = None) -> int:
        """Number of ops on ``target`` (all targets when None)."""
        if target is not None:
            return sum(self.counts.get(target, Counter()).values())
        return sum(sum(c.values()) for c in self.counts.values())

    def __str__(self) -> str:
        lines = []
        for target in sorted(self.counts, key=lambda t: (t != HOST, t)):
            ops = self.counts[target]
            lines.append(f"{target}: {self._headline(target)}")
            for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
                lines.append(f"    {op:<28} {n}")
        return "\n".join(lines)

    __repr__ = __str__

    def _headline(self, target: str) -> str:
        """``12 ops``; for an offload target, whether they are offloaded (in regions) or only
        marked for it (in composites, still compiled by TVM if no region takes them)."""
        n = self.total(target)
        if target == HOST or (target not in self.regions and target not in self.composites):
            return f"{n} ops"
        regions, composites = self.regions[target], self.composites[target]
        if regions:
            return f"{n} ops in {_plural(regions, 'region')} ({_plural(composites, 'composite')})"
        return f"{n} ops marked in {_plural(composites, 'composite')}, not offloaded yet (0 regions)"

    def changes(self, before: "OpProfile") -> list[str]:
        """What changed from ``before`` to this profile, one line per target: ops moved, composites and
        regions made or merged, and which op kinds moved (what the demo prints after each stage);
        empty when nothing moved."""
        lines = []
        for target in sorted(set(self.counts) | set(before.counts), key=lambda t: (t != HOST, t)):
            parts = []
            was, now = before.total(target), self.total(target)
            if was != now:
                parts.append(f"ops {was} -> {now}")
            for what, old, new in (("composites", before.composites[target], self.composites[target]),
                                   ("regions", before.regions[target], self.regions[target])):
                if old != new:
                    parts.append(f"{what} {old} -> {new}")
            delta = Counter(self.counts.get(target, {}))
            delta.subtract(before.counts.get(target, {}))
            moved = [f"{op} {n:+d}" for op, n in sorted(delta.items(), key=lambda kv: (-abs(kv[1]), kv[0])) if n]
            if moved:
                parts.append(", ".join(moved[:6]) + (", ..." if len(moved) > 6 else ""))
            if parts:
                lines.append(f"{target}: " + "; ".join(parts))
        return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _count_function(func: relax.Function, target: str, mod: tvm.IRModule, prof: OpProfile,
                    ext: dict) -> None:
    """Count the ops of ``func`` for ``target``, descending into called composites/regions."""
    local = local_functions(func)

    def visit(expr):
        if isinstance(expr, relax.Function):
            return
        if not isinstance(expr, relax.Call):
            return
        full = op_name(expr)
        op = short_op_name(full) if full is not None else None
        if op == "call_dps_packed":
            region = ext.get(str(expr.args[0].global_symbol))
            if region is not None:
                for name, n in region.ops.items():
                    prof.add(region.target, name, n)
                prof.regions[region.target] += 1
                prof.composites[region.target] += len(region.composites)
                return
        if op is not None:
            if op not in ("call_tir", "call_dps_packed") and not is_range_check(expr):
                prof.add(target, op)
            return
        callee = called_function(mod, expr, local)
        if callee is not None:
            region, composite = region_target(callee), composite_target(callee)
            if region is not None:
                prof.regions[canonical_name(region)] += 1
            elif composite is not None:
                prof.composites[canonical_name(composite)] += 1
            _count_function(callee, region or composite or target, mod, prof, ext)

    if isinstance(func.body, relax.SeqExpr):
        for block in func.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding.value, relax.Function):
                    relax.analysis.post_order_visit(binding.value, visit)


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
    prof = OpProfile()
    _count_function(mod[entry], HOST, mod, prof, region_table(mod))
    return prof
