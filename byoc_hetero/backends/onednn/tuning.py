"""The oneDNN backend's knobs (:class:`~byoc_hetero.rules.Knob`): what ``bh.tune`` may decide for
its regions, keyed the backend's way and applied through its options.

* ``algorithm`` (option ``algorithms``): direct or Winograd per convolution site
  (:class:`ConvSite`, keyed by :func:`.ops.conv2d.conv_site_key`); the choices are the conv2d
  :data:`~byoc_hetero.backends.onednn.VARIANTS` of level ``algorithm``; a site is timed alone as
  a one-node region of the runtime (:class:`OneConv`);
* ``precision`` (option ``node_precisions``): f32 or bf16 per conv2d / dense / matmul node, keyed
  by region symbol and what the node computes (:func:`.precision.content_keys`: op, weight shape and
  digest), which survives the passes that differ between the partition measured and the one applied;
* ``threads`` (option ``region_threads``): the process's thread count or fewer per region, keyed
  by the region's key.

The tuner (:mod:`byoc_hetero.tune`) reads these through the backend object and names no backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import tvm

from ...targets import Knob
from .ops.conv2d import conv_site_key, float_conv_sites
from . import precision
from .precision import content_keys, locate_node, node_precision_reason
from .table import TARGET


@dataclass(frozen=True)
class ConvSite:
    """One distinct float32 NCHW/OIHW convolution (what its timing depends on)."""

    data_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    strides: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    backend: ClassVar[str] = TARGET  # whose knob decides it

    def attrs(self) -> dict:
        return {"strides": list(self.strides), "padding": list(self.padding),
                "dilation": list(self.dilation), "groups": self.groups}

    def key(self) -> str:
        """The key the decision is given to the backend under (its option ``algorithms``)."""
        return conv_site_key(self.data_shape, self.weight_shape, self.attrs())

    def timing_parts(self) -> tuple[str, list, list, dict]:
        """``(op, shapes, dtypes, attrs)``: what the site's timing-cache signature is made of."""
        return "conv2d", [self.data_shape, self.weight_shape], ["float32"], self.attrs()

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


def conv_sites_of(graph: Mapping[str, Any]) -> Iterator[ConvSite]:
    """The float32 convolutions of one region document, as the region runs them (after the region
    passes folded pads into them)."""
    tensors = graph.get("tensors", [])
    for node, _key in float_conv_sites(tensors, graph.get("nodes", [])):
        a = node.get("attrs", {})
        yield ConvSite(tuple(tensors[node["inputs"][0]]["shape"]), tuple(tensors[node["inputs"][1]]["shape"]),
                       tuple(a.get("strides", (1, 1))), tuple(a.get("padding", (0, 0, 0, 0))),
                       tuple(a.get("dilation", (1, 1))), int(a.get("groups", 1)))


def _region_doc(site: ConvSite, algo: str) -> str:
    tensors = [{"shape": list(site.data_shape), "dtype": "float32"},
               {"shape": list(site.weight_shape), "dtype": "float32"},
               {"shape": list(site.output_shape()), "dtype": "float32"}]
    node = {"op": "conv2d", "inputs": [0, 1], "output": 2, "attrs": dict(site.attrs(), algo=algo)}
    return json.dumps({"format": "byoc_hetero.region", "version": 1, "symbol": "tune_conv",
                       "tensors": tensors, "inputs": [0], "outputs": [2],
                       "constants": [{"tensor": 1, "name": "tune_conv_w"}], "nodes": [node]})


class OneConv:
    """A one-node region module running ``site`` with ``algo``, ready to call.

    Which algorithm the runtime picks is read from its plan at creation (``get_plan`` answers before
    the weights are given); the weights are prepared on the first call only, so a tune whose
    timings all come from the cache never pays for them (0.8 s for ResNet-18's 22 probes)."""

    def __init__(self, site: ConvSite, algo: str, seed: int = 0):
        from ..._native import _C  # noqa: F401  (registers the runtime)

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


def _conv_default(site: ConvSite) -> str:
    """What the runtime's thresholds pick for ``site``."""
    return "winograd" if OneConv(site, "auto").winograd else "direct"


def _conv_probe(site: ConvSite, algo: str) -> OneConv | None:
    """``site`` alone run by ``algo``; None where the runtime would not run it so (Winograd that
    does not apply)."""
    probe = OneConv(site, algo)
    return None if algo == "winograd" and not probe.winograd else probe


def _conv_fixed(site: ConvSite) -> str:
    if len(site.data_shape) != 4:  # Whisper's / wav2vec2's conv1d, conv3d: one algorithm, not built
        return (f"a {len(site.data_shape) - 2}-D convolution: Winograd F(4x4, 3x3) applies to 2-D "
                "ones only, the runtime's default is kept")
    return ""


def _precision_native(asked: str) -> str:
    """Why ``asked`` runs as another precision on this machine ("" where it runs as asked); read
    through the module at each call (a test may stand in for the CPU's answer). int8 runs as asked
    where oneDNN's int8 kernels are exact (VNNI, or ``BYOC_HETERO_INT8=saturating``); elsewhere
    its conv2d / dense / matmul compute float32 between their Q/DQ steps."""
    if asked == "int8":
        return precision.int8_kernels_reason() or ""
    return precision.effective_precision(asked)[1]


KNOBS = {
    "algorithm": Knob("algorithm", "algorithms", "conv2d", units=conv_sites_of, probe=_conv_probe,
                      default=_conv_default, fixed=_conv_fixed),
    "precision": Knob("precision", "node_precisions", keys=content_keys, locate=locate_node,
                      node_reason=node_precision_reason,
                      native=_precision_native),
    "threads": Knob("threads", "region_threads"),
}
"""The oneDNN backend's knobs by tuning level."""

__all__ = ["KNOBS", "ConvSite", "OneConv", "conv_sites_of"]
