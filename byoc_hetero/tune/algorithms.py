"""The algorithm level: for each convolution, direct or Winograd, from timings taken on this machine.

The runtime picks Winograd F(4x4, 3x3) by fixed thresholds (at least 25 output tiles, tile buffers
under 256 MiB; ``cpp/kernels/winograd.cc``), measured once on one machine's benchmark layers. Here
each distinct convolution of a partitioned model (its :class:`ConvSite`: shapes, strides,
padding, dilation, groups, read from the regions as they run) is built alone as a one-node region of the runtime with random weights of its real shape,
once per algorithm, and timed (:func:`.measure.time_call`). The faster one is the decision; the
decision reaches the oneDNN backend as its option ``algorithms`` (site key → algorithm), whose
last region pass writes it into the convolution's node as ``algo`` (docs/region-format.md), which
wins over the thresholds. Sites where Winograd does not apply (not 3x3 stride 1, channels not in
multiples of 16, ...) have one candidate and are not timed.

Timings go through a :class:`.cache.TimingCache` under the site's signature and the algorithm, so
a ResNet's repeated blocks are timed once, and a second tune of a model reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm

from ..backends.onednn.ops.conv2d import conv_site_key, float_conv_sites
from .cache import Timing, TimingCache, signature
from .measure import time_call

ALGORITHMS = ("direct", "winograd")


@dataclass(frozen=True)
class ConvSite:
    """One distinct float32 NCHW/OIHW convolution (what its timing depends on)."""

    data_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    strides: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1

    def attrs(self) -> dict:
        return {"strides": list(self.strides), "padding": list(self.padding),
                "dilation": list(self.dilation), "groups": self.groups}

    def key(self) -> str:
        """The key the decision is given to the backend under (its option ``algorithms``)."""
        return conv_site_key(self.data_shape, self.weight_shape, self.attrs())

    def timing_key(self, algo: str) -> str:
        """The timing-cache signature of this site run by ``algo``."""
        return signature("conv2d", [self.data_shape, self.weight_shape], ["float32"], self.attrs(), algo)

    def output_shape(self) -> tuple[int, int, int, int]:
        n, _, h, w = self.data_shape
        o, _, kh, kw = self.weight_shape
        top, left, bottom, right = self.padding
        oh = (h + top + bottom - ((kh - 1) * self.dilation[0] + 1)) // self.strides[0] + 1
        ow = (w + left + right - ((kw - 1) * self.dilation[1] + 1)) // self.strides[1] + 1
        return (n, o, oh, ow)

    def __str__(self) -> str:
        n, c, *space = self.data_shape
        o, _, *kernel = self.weight_shape
        return (f"conv{len(space)}d {c}->{o} {'x'.join(map(str, kernel))} s{self.strides[0]} on "
                f"{'x'.join(map(str, space))} (batch {n})")


def conv_sites(partitioned: tvm.IRModule) -> list[ConvSite]:
    """The distinct float32 convolutions of a partitioned module's oneDNN regions, as the regions
    run them (after the region passes folded pads into them), in the order first met."""
    from .._relax import region_table

    sites: dict[ConvSite, None] = {}
    for entry in region_table(partitioned).values():
        graph = entry.graph or {}
        tensors = graph.get("tensors", [])
        for node, _key in float_conv_sites(tensors, graph.get("nodes", [])):
            a = node.get("attrs", {})
            sites[ConvSite(tuple(tensors[node["inputs"][0]]["shape"]), tuple(tensors[node["inputs"][1]]["shape"]),
                           tuple(a.get("strides", (1, 1))), tuple(a.get("padding", (0, 0, 0, 0))),
                           tuple(a.get("dilation", (1, 1))), int(a.get("groups", 1)))] = None
    return list(sites)


def _region_doc(site: ConvSite, algo: str) -> str:
    tensors = [{"shape": list(site.data_shape), "dtype": "float32"},
               {"shape": list(site.weight_shape), "dtype": "float32"},
               {"shape": list(site.output_shape()), "dtype": "float32"}]
    node = {"op": "conv2d", "inputs": [0, 1], "output": 2, "attrs": dict(site.attrs(), algo=algo)}
    return json.dumps({"format": "byoc_hetero.region", "version": 1, "symbol": "tune_conv",
                       "tensors": tensors, "inputs": [0], "outputs": [2],
                       "constants": [{"tensor": 1, "name": "tune_conv_w"}], "nodes": [node]})


class _OneConv:
    """A one-node region module running ``site`` with ``algo``, ready to call.

    Which algorithm the runtime picks is read from its plan at creation (``get_plan`` answers before
    the weights are given); the weights are prepared on the first call only, so a tune whose
    timings all come from the cache never pays for them (0.8 s for ResNet-18's 22 probes)."""

    def __init__(self, site: ConvSite, algo: str, seed: int = 0):
        from .._native import _C  # noqa: F401  (registers the runtime)

        self.site, self.algo, self.seed = site, algo, seed
        self.module = tvm.get_global_func("byoc_hetero.runtime.create")(_region_doc(site, algo))
        self.winograd = any("winograd" in line for line in self.module["get_plan"]())
        self.args: list | None = None

    def _prepare(self) -> None:
        rng = np.random.default_rng(self.seed)
        w = (rng.standard_normal(self.site.weight_shape) * 0.1).astype("float32")
        if self.module["__init_tune_conv"]([tvm.runtime.tensor(w)]) != 0:
            raise RuntimeError(f"could not initialize the {self.algo} region of {self.site}")
        self.args = [tvm.runtime.tensor(rng.standard_normal(self.site.data_shape).astype("float32")),
                     tvm.runtime.tensor(np.zeros(self.site.output_shape(), "float32"))]
        self.fn = self.module["tune_conv"]

    def __call__(self) -> None:
        if self.args is None:
            self._prepare()
        self.fn(*self.args)


@dataclass
class AlgorithmDecision:
    """What was measured for one site and what won."""

    site: ConvSite
    timings: dict[str, Timing] = field(default_factory=dict)
    chosen: str = "direct"
    default: str = "direct"  # what the built-in thresholds pick
    cached: bool = False
    kept_because: str = ""  # why the level kept the default without building the site (bad input)

    def why(self) -> str:
        if self.kept_because:
            return f"{self.chosen}: {self.kept_because}"
        if len(self.timings) < 2:
            return f"{self.chosen}: the only algorithm that applies"
        parts = ", ".join(f"{a} {t.median_s * 1e6:.1f} µs" for a, t in sorted(self.timings.items()))
        change = "" if self.chosen == self.default else f" (the thresholds pick {self.default})"
        return f"{self.chosen} is fastest: {parts}{change}"


def _measure(site: ConvSite, algo: str, cache: TimingCache, repeat: int,
             built: _OneConv | None = None) -> tuple[Timing, bool]:
    key = site.timing_key(algo)
    hit = cache.get(key)
    if hit is not None:
        return hit, True
    timing = time_call(built or _OneConv(site, algo), warmup=3, repeat=repeat, min_total_s=0.05)
    cache.put(key, timing)
    return timing, False


def tune_conv_algorithms(sites: Iterable[ConvSite], cache: TimingCache | None = None,
                         repeat: int = 15) -> list[AlgorithmDecision]:
    """Time each site's applicable algorithms (through ``cache``) and pick the fastest."""
    cache = cache if cache is not None else TimingCache(None)
    decisions = []
    for site in sites:
        d = AlgorithmDecision(site)
        if len(site.data_shape) != 4:  # Whisper's / wav2vec2's conv1d, conv3d: one algorithm, not built here
            d.kept_because = (f"a {len(site.data_shape) - 2}-D convolution: Winograd F(4x4, 3x3) applies to 2-D "
                              "ones only, the runtime's default is kept")
            decisions.append(d)
            continue
        d.default = "winograd" if _OneConv(site, "auto").winograd else "direct"
        probe = _OneConv(site, "winograd")
        if not probe.winograd:  # Winograd does not apply: nothing to time
            d.chosen = "direct"
            decisions.append(d)
            continue
        hits = []
        for algo in ALGORITHMS:  # the probe is the Winograd module: timed as it is, not built again
            d.timings[algo], hit = _measure(site, algo, cache, repeat, probe if algo == "winograd" else None)
            hits.append(hit)
        d.cached = all(hits)
        d.chosen = min(d.timings, key=lambda a: d.timings[a].median_s)
        decisions.append(d)
    return decisions


def decisions_option(decisions: Sequence[AlgorithmDecision]) -> str:
    """The oneDNN backend's option ``algorithms`` that applies ``decisions`` (JSON: site key →
    algorithm), naming only the sites where the decision differs from the thresholds'."""
    return json.dumps({d.site.key(): d.chosen for d in decisions if d.chosen != d.default}, sort_keys=True)
