"""A/B of one GQA attention block at SmolLM-135M's sizes (9 query / 3 key-value heads of 64, S = 128,
causal mask, Q and K^T scaled as torch's sdpa decomposition writes it): the fused attention node
(BYOC_HETERO_ATTENTION=fused) against the separate steps (off), interleaved, whole-call medians.

    PYTHONPATH=$PWD python bench/gqa_attention.py [rounds] [threads ...]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import _C
from byoc_hetero.timing import build

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from conftest import graph  # noqa: E402

R = relax.op
KV, GROUP, S, D = 3, 3, 128, 64
HEADS = KV * GROUP


def block():
    """q [1, 9, S, D], k / v [1, 3, 1, S, D], mask [1, 1, S, S] -> [1, 9, S, D] (Llama's 5-D GQA form)."""
    c = relax.const(np.float32(D ** -0.25))

    def body(emit, q, k, v, mask):
        q5 = emit(R.reshape(emit(R.multiply(q, c)), (1, KV, GROUP, S, D)))
        kt = emit(R.multiply(emit(R.permute_dims(k, [0, 1, 2, 4, 3])), c))
        s = emit(R.add(emit(R.reshape(emit(R.matmul(q5, kt)), (1, HEADS, S, S))), mask))
        p = emit(R.reshape(emit(R.nn.softmax(s, axis=-1)), (1, KV, GROUP, S, S)))
        return R.reshape(emit(R.matmul(p, v)), (1, HEADS, S, D))

    return graph({"q": (1, HEADS, S, D), "k": (1, KV, 1, S, D), "v": (1, KV, 1, S, D), "mask": (1, 1, S, S)}, body)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    threads = [int(t) for t in sys.argv[2:]] or [2, 1]
    rng = np.random.default_rng(0)
    mask = np.triu(np.full((S, S), -np.inf, "float32"), 1)[None, None]
    args = [tvm.runtime.tensor(a) for a in (rng.standard_normal((1, HEADS, S, D)).astype("float32"),
                                            rng.standard_normal((1, KV, 1, S, D)).astype("float32"),
                                            rng.standard_normal((1, KV, 1, S, D)).astype("float32"), mask)]
    vms = {}
    for mode in ("off", "fused"):
        os.environ["BYOC_HETERO_ATTENTION"] = mode
        vms[mode] = relax.VirtualMachine(build(bh.partition(block())), tvm.cpu())
    outs = [vm["main"](*args).numpy() for vm in vms.values()]
    print(f"max |fused - off| {np.abs(outs[0] - outs[1]).max():.2e}")
    for n in threads:
        _C.set_num_threads(n)
        times: dict[str, list[float]] = {m: [] for m in vms}
        for _ in range(rounds):  # interleaved: the load of the machine falls on both sides alike
            for mode, vm in vms.items():
                t = time.perf_counter()
                vm["main"](*args)
                times[mode].append(time.perf_counter() - t)
        med = {m: statistics.median(t) * 1e3 for m, t in times.items()}
        print(f"threads {n}: off {med['off']:.3f} ms, fused {med['fused']:.3f} ms, fused/off {med['fused'] / med['off']:.2f}")


if __name__ == "__main__":
    main()
