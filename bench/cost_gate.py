"""Measure the cost gate's effect: end-to-end latency for several ``min_region_ops`` values.

Run: ``python bench/cost_gate.py`` (ResNet-18 and the MLP at batch 1, 224x224 / 784 features).
The defaults of byoc_hetero.stages (``min_region_ops=1``, ``require_heavy_op=True``) come from
this table: the smallest gate that never made a model slower, and whether a region without a conv/dense
is worth its boundary.
"""

from __future__ import annotations

import argparse

import byoc_hetero as bh
from byoc_hetero.timing import build, median_latency, random_inputs


def eltwise_chain(n: int = 8, shape=(1, 64, 56, 56)):
    """sin (stays on llvm) and relu (offloadable alone) alternating: regions without a heavy op."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(n):
                y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.sin(y))))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get(), {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gates", type=int, nargs="+", default=[1, 4, 8, 12])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    workloads = {
        "resnet18": bh.models.resnet18(),
        "mlp": bh.models.mlp(),
        "small_convnet": bh.models.small_convnet(image_size=32),
    }
    workloads["eltwise_chain"] = eltwise_chain()
    print(f"{'model':<14} {'min_region_ops':>14} {'heavy op':>9} {'regions':>8} {'llvm ops':>9} {'median ms':>10}")
    for name, (mod, params) in workloads.items():
        inputs = random_inputs(mod, params)
        for gate in args.gates:
            for heavy in (True, False):
                part = bh.partition(mod, params, min_region_ops=gate, require_heavy_op=heavy)
                prof = bh.op_profile(part)
                t = median_latency(build(part), inputs, repeat=args.repeat)
                print(f"{name:<14} {gate:>14} {str(heavy):>9} {prof.regions.get('byoc_hetero', 0):>8} "
                      f"{prof.total('llvm'):>9} {t * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
