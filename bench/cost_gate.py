"""Measure the cost gate's effect: end-to-end latency for several ``min_region_ops`` values.

Run: ``python bench/cost_gate.py`` (ResNet-18 and the MLP at batch 1, 224x224 / 784 features).
The default ``min_region_ops`` in byoc_hetero.stages comes from this table: the smallest gate
that never made a model slower.
"""

from __future__ import annotations

import argparse

import byoc_hetero as bh
from byoc_hetero.timing import build, median_latency, random_inputs


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
    print(f"{'model':<14} {'min_region_ops':>14} {'regions':>8} {'llvm ops':>9} {'median ms':>10}")
    for name, (mod, params) in workloads.items():
        inputs = random_inputs(mod, params)
        for gate in args.gates:
            part = bh.partition(mod, params, min_region_ops=gate)
            prof = bh.op_profile(part)
            t = median_latency(build(part), inputs, repeat=args.repeat)
            print(f"{name:<14} {gate:>14} {prof.regions.get('byoc_hetero', 0):>8} "
                  f"{prof.total('llvm'):>9} {t * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
