"""Export softmax(q @ k^T / sqrt(d) + mask), the mask of the scores' full shape (the matmul's residual), and its
inputs, for ``bench/build_ab.py``: under ``ONEDNN_MAX_CPU_ISA=AVX2`` the scaled matmul with that add is oneDNN's
reference kernel unless the add runs as its own step (``BYOC_HETERO_MATMUL_SPLIT_EPILOGUE``).

    python3 bench/export_masked_scores.py --out /tmp/scores   # writes /tmp/scores.so and /tmp/scores.npz
    ONEDNN_MAX_CPU_ISA=AVX2 BYOC_HETERO_NUM_THREADS=1 OMP_NUM_THREADS=1 python3 bench/build_ab.py \\
        --a /tmp/scores.so --knob BYOC_HETERO_MATMUL_SPLIT_EPILOGUE --inputs /tmp/scores.npz
"""

from __future__ import annotations

import argparse

import numpy as np


def masked_scores(heads: int, seq: int, dim: int):
    """The Relax module: main(q, k, mask) with q, k [1, heads, seq, dim] and mask [1, heads, seq, seq]."""
    from tvm import relax

    R = relax.op
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, heads, seq, dim), "float32"))
    k = relax.Var("k", relax.TensorType((1, heads, seq, dim), "float32"))
    mask = relax.Var("mask", relax.TensorType((1, heads, seq, seq), "float32"))
    with bb.function("main", [q, k, mask]):
        with bb.dataflow():
            s = bb.emit(R.matmul(q, bb.emit(R.permute_dims(k, [0, 1, 3, 2]))))
            s = bb.emit(R.add(bb.emit(R.multiply(s, relax.const(np.float32(1 / np.sqrt(dim))))), mask))
            out = bb.emit_output(R.nn.softmax(s, axis=-1))
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    import byoc_hetero as bh
    from byoc_hetero.timing import build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path prefix: <out>.so and <out>.npz")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=64)
    args = ap.parse_args()
    build(bh.partition(masked_scores(args.heads, args.seq, args.dim))).export_library(f"{args.out}.so")
    rng = np.random.default_rng(0)
    shape = (1, args.heads, args.seq, args.dim)
    np.savez(f"{args.out}.npz", q=rng.standard_normal(shape).astype("float32"),
             k=rng.standard_normal(shape).astype("float32"),
             mask=np.where(rng.random((1, args.heads, args.seq, args.seq)) < 0.3, -1e4, 0).astype("float32"))


if __name__ == "__main__":
    main()
