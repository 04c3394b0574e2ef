"""Which node each layer became in the int8 choice's partitions, kept in the timing cache.

The int8 choice (:mod:`.int8`) names a layer's node in two partitions of the model: the all-int8
one (whose int8 nodes are timed alone) and, for a mix with bf16 layers, the partition of that mix
without bf16 (whose float nodes the ``node_precisions`` option then names). Working those out
takes a whole partition each: on a warm tune of ResNet-50 (f32 / bf16 / int8, loaded 2-core
machine) the all-int8 partition was 1.0 s and the kept mix's extra partition about 1 s of 9.2 s,
although every timing and error came from the cache.

A map is a pure function of what the partition is made from, so it is stored in the cache's
``values`` under a signature of exactly that: the model (:func:`.reuse.model_digest`), the
calibration inputs the quantization ranges came from (:func:`.plan_errors.inputs_digest`), the
targets and backend options, the set of int8 layers, and which map it is. The cache itself is
only read on the machine, library versions, runtime build and Python sources it was written with
(:class:`.cache.MachineKey`: other sources may partition otherwise). Where the partition is made anyway (a mix that is built), the caller
checks the map against it (:meth:`NodeMaps.check`) and a map that does not match is replaced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .cache import TimingCache, signature


def _as_map(value: Any) -> dict[int, str] | None:
    """A stored map (JSON: layer index as text -> node key) as ints -> text, None when malformed."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        return None
    try:
        return {int(k): v for k, v in value.items()}
    except (TypeError, ValueError):
        return None


class NodeMaps:
    """Layer index -> node key maps of one tune's partitions: from memory, from ``cache`` (when
    ``identity`` names the model and its calibration inputs), or computed (then stored in both)."""

    def __init__(self, cache: TimingCache | None, identity: Mapping[str, str] | None, settings: str):
        self.cache, self.identity, self.settings = cache, dict(identity) if identity else None, settings
        self.memo: dict[tuple[str, tuple[int, ...]], dict[int, str]] = {}
        self.replaced = 0  # stored maps a built partition contradicted

    def _key(self, what: str, int8: tuple[int, ...]) -> str | None:
        if self.cache is None or self.identity is None:
            return None
        attrs = dict(self.identity, settings=self.settings, int8=",".join(map(str, int8)))
        return signature("layer_nodes", attrs=attrs, choice=what)

    def get(self, what: str, int8: Iterable[int], compute: Callable[[], Mapping[int, str]]) -> dict[int, str]:
        """The ``what`` map of the partition with layers ``int8`` quantized."""
        layers = tuple(sorted(int8))
        if (what, layers) in self.memo:
            return self.memo[(what, layers)]
        key = self._key(what, layers)
        found = _as_map(self.cache.get_value(key)) if key is not None else None
        if found is None:
            found = self.put(what, layers, compute())
        self.memo[(what, layers)] = found
        return found

    def put(self, what: str, int8: Iterable[int], value: Mapping[int, str]) -> dict[int, str]:
        """Store ``value`` as the ``what`` map of the partition with layers ``int8`` quantized."""
        layers, value = tuple(sorted(int8)), {int(k): str(v) for k, v in value.items()}
        key = self._key(what, layers)
        if key is not None:
            self.cache.put_value(key, {str(k): v for k, v in sorted(value.items())})
        self.memo[(what, layers)] = value
        return value

    def check(self, what: str, int8: Iterable[int], used: Mapping[int, str], actual: Mapping[int, str]) -> bool:
        """Whether the map ``used`` equals ``actual`` (worked out from a partition made since);
        when it does not, ``actual`` replaces it (counted in :attr:`replaced`)."""
        if dict(used) == dict(actual):
            return True
        self.replaced += 1
        self.put(what, int8, actual)
        return False


__all__ = ["NodeMaps"]
