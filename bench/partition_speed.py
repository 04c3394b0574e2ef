"""How long the four partition stages take as the graph grows (issue: compiler speed).

A deep ResNet-like chain of blocks, each conv2d → add(bias) → relu → conv2d → add(bias) → add
(residual) → relu (7 Relax ops + 2 reshapes per block), small tensors, weights bound as constants.
Prints ops, seconds per stage and in all, µs per op, and ``growth``: how much faster the total time
grew than the op count since the previous size ((t/t_prev) / (ops/ops_prev): 1.0 is linear, 2.0 per
doubling is quadratic). µs/op should stay about flat and growth about 1.
Run: ``python bench/partition_speed.py [--sizes 500 1000 2000 4000]``.

It measures the ``byoc_hetero`` of this checkout (its Python; the compiled runtime comes from the
installed package).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tvm import relax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import byoc_hetero as bh  # noqa: E402


def resnet_chain(num_ops: int, channels: int = 8, size: int = 8):
    """A Relax module with about ``num_ops`` ops (residual blocks of 9 ops) and its params."""
    bb = relax.BlockBuilder()
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    params = {}
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for i in range(max(1, num_ops // 9)):
                res = y
                for j in range(2):
                    w = relax.const(rng.standard_normal((channels, channels, 3, 3)).astype("float32") * 0.1)
                    b = relax.const(rng.standard_normal(channels).astype("float32") * 0.1)
                    y = bb.emit(relax.op.nn.conv2d(y, w, padding=1))
                    y = bb.emit(relax.op.add(y, relax.op.reshape(b, (1, channels, 1, 1))))
                    if j == 0:
                        y = bb.emit(relax.op.nn.relu(y))
                y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, res))))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    return bb.get(), params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    args = parser.parse_args()
    print(f"{'ops':>6} {'MergeComposite':>15} {'AnnotateTarget':>15} {'MergeRegions':>13} "
          f"{'PartitionGraph':>15} {'total s':>8} {'us/op':>7} {'growth':>7}")
    prev = None
    for size in args.sizes:
        mod, _ = resnet_chain(size)
        ops = bh.op_profile(mod).total()
        times = []
        m = mod
        for stage in bh.stages():
            start = time.perf_counter()
            m = stage(m)
            times.append(time.perf_counter() - start)
        total = sum(times)
        growth = f"{(total / prev[1]) / (ops / prev[0]):>7.2f}" if prev else f"{'':>7}"
        prev = (ops, total)
        print(f"{ops:>6} {times[0]:>15.2f} {times[1]:>15.2f} {times[2]:>13.2f} {times[3]:>15.2f} "
              f"{total:>8.2f} {total / ops * 1e6:>7.0f} {growth}", flush=True)


if __name__ == "__main__":
    main()
