"""Pass ``shorten_region_names`` (Relax, after merging): long region names get a checksum."""

from __future__ import annotations

import zlib

import tvm
from tvm import relax

from .._relax import is_region, updated

MAX_REGION_NAME = 256
"""Longest region (external symbol) name kept as MergeCompositeFunctions made it, in characters."""


def shorten_region_names(mod: tvm.IRModule) -> tvm.IRModule:
    """Give regions whose name is longer than ``MAX_REGION_NAME`` a shorter one.

    MergeCompositeFunctions names a region after all its composites (``fused_<c1>_<c2>_..._<target>``),
    so a region of n composites has a name O(n) long. RunCodegen names each constant of the region
    ``<symbol>_<target>_const_<i>``, which made the constant names, the region graph's JSON and the
    runtime's constant table O(n^2) in size. A long name keeps its first part and gets a checksum of
    the full name: ``fused_<c1>_<c2>_..._<crc32>_<target>``; short names are left as they are.
    """
    taken = {gv.name_hint for gv in mod.get_global_vars()}
    renamed = {}
    for gv, func in mod.functions.items():
        name = gv.name_hint
        if len(name) <= MAX_REGION_NAME or not is_region(func):
            continue
        tail = f"_{zlib.crc32(name.encode()):08x}_{func.attrs['Codegen']}"
        head = name[:MAX_REGION_NAME - len(tail) - 4]
        head = head[:head.rindex("_")] if "_" in head else head
        new, k = head + tail, 0
        while new in taken:
            k += 1
            new = f"{head}{k}{tail}"
        taken.add(new)
        renamed[gv] = func.with_attr("global_symbol", new)
    if not renamed:
        return mod
    return relax.transform.NormalizeGlobalVar()(updated(mod, renamed))
