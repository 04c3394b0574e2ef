"""The code left on llvm, plain and scheduled: a small Swin block with torch.roll.

Run: ``python3 bench/tvm_cpu.py [--rounds 3] [--repeat 10]``. Exported by the default exporter
(``bh.from_torch``): LayerNorm, roll by (-3, -3) (a take of constant rolled indices per axis),
window partition (reshape / permute), window attention (qkv linear, q @ k^T, softmax, @ v,
projection), window merge, roll back, residual, MLP. Built four ways from the same partition and
timed side by side (:func:`byoc_hetero.tune.measure.time_alternately`):

- ``llvm only``: stock ``relax.build`` of the unpartitioned module (TVM's plain code everywhere);
- ``onednn + plain llvm``: ``bh.partition`` (default target), stock ``relax.build``: what stays
  on llvm (the rolls, the window permutes, ...) is TVM's single-threaded scalar code;
- ``onednn + scheduled llvm``: the same partition built by ``bh.build``: what stays on llvm gets
  the CPU schedules of ``byoc_hetero/backends/tvm_cpu/schedule.py`` (parallel, vectorized);
- ``onednn + tvm_cpu``: ``target=["onednn", "tvm_cpu"]``, the regions of oneDNN as the cost gate
  decides them and every region tvm_cpu forms (of what oneDNN refuses) kept on tvm_cpu (a codegen
  map over :func:`byoc_hetero.tune.codegen.candidate_regions`), built by ``bh.build``.

Every output is checked against the llvm-only build (max relative difference <= 1e-4). Prints a
markdown row per build: median ms and the ratio to ``onednn + plain llvm``.

``--ops`` adds a table of single ops at Swin-T stage-1 sizes (1x56x56x96, batch 8 where noted),
each built by stock ``relax.build`` (plain) and by ``bh.build`` (scheduled), timed side by side.

``--meta-schedule`` (alone: ``--meta-schedule --no-block``) adds a table of the same single ops and window
attention's ``q @ k^T`` each as one tvm_cpu region, scheduled by the fixed rules (``schedule="dlight"``) and by
MetaSchedule (``schedule="meta_schedule"``: its search, ``meta_schedule.TRIALS`` candidates at most, runs in the
partition and is reported), timed side by side; an op tvm_cpu does not take (a constant argument) is left out.
"""

from __future__ import annotations

import argparse
import platform
import subprocess

import numpy as np
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import relative_error
from byoc_hetero.tune.codegen import candidate_regions
from byoc_hetero.tune.measure import time_alternately


def swin_block(dim: int = 96, heads: int = 3, window: int = 7, shift: int = 3):
    """A torch Swin block (torchvision's ``shifted_window_attention`` without relative position
    bias and dropout): the shifted-window mask is built in ``forward`` as torchvision builds it
    (zeros, slice assignments, a difference, masked_fill), which the exporter spells as
    strided_slice / scatter / where: the ops that stay on llvm."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, h, w, c = x.shape
            y = torch.roll(self.norm1(x), shifts=(-shift, -shift), dims=(1, 2))
            y = y.view(b, h // window, window, w // window, window, c).permute(0, 1, 3, 2, 4, 5)
            y = y.reshape(-1, window * window, c)
            q, k, v = self.qkv(y).reshape(y.shape[0], -1, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-2, -1) * (c // heads) ** -0.5).view(b, -1, heads, window * window, window * window)
            a = torch.softmax((a + _mask(x, h, w).unsqueeze(1).unsqueeze(0)).view(-1, heads, window * window,
                                                                                 window * window), dim=-1)
            y = self.proj((a @ v).transpose(1, 2).reshape(y.shape[0], -1, c))
            y = y.view(b, h // window, w // window, window, window, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
            x = x + torch.roll(y, shifts=(shift, shift), dims=(1, 2))
            return x + self.mlp(self.norm2(x))

    def _mask(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        mask = x.new_zeros((h, w))
        bounds = ((0, -window), (-window, -shift), (-shift, None))
        count = 0
        for hs in bounds:
            for ws in bounds:
                mask[hs[0]:hs[1], ws[0]:ws[1]] = count
                count += 1
        mask = mask.view(h // window, window, w // window, window).permute(0, 2, 1, 3).reshape(-1, window * window)
        mask = mask.unsqueeze(1) - mask.unsqueeze(2)
        return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)

    torch.manual_seed(0)
    return Block().eval()


def single_ops() -> dict:
    """Single-op modules at Swin-T stage-1 sizes: what the scheduled fallback does per op kind."""
    shape = (8, 56, 56, 96)
    idx = relax.const(np.array([(i + 3) % 56 for i in range(56)], dtype="int64"))
    ops = {
        "permute_dims (window partition)": lambda e, x: relax.op.reshape(e(relax.op.permute_dims(
            e(relax.op.reshape(x, (8, 8, 7, 8, 7, 96))), [0, 1, 3, 2, 4, 5])), (512, 49, 96)),
        "take (roll by 3 along H)": lambda e, x: relax.op.take(x, idx, axis=1),
        "strided_slice": lambda e, x: relax.op.strided_slice(x, axes=[1], begin=[3], end=[56]),
        "multiply + add": lambda e, x: relax.op.add(e(relax.op.multiply(x, relax.const(0.5))), x),
        "exp": lambda e, x: relax.op.exp(x),
        "sum over C": lambda e, x: relax.op.sum(x, axis=[3]),
        "softmax over C": lambda e, x: relax.op.nn.softmax(x, axis=-1),
    }
    out = {}
    for name, op in ops.items():
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(shape, "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                y = bb.emit_output(op(bb.emit, x))
            bb.emit_func_output(y)
        out[name] = bb.get()
    return out


def _ops_table(rounds: int, repeat: int) -> None:
    x = np.random.default_rng(0).standard_normal((8, 56, 56, 96)).astype("float32")
    print("| op (8x56x56x96 float32) | plain ms | scheduled ms | plain / scheduled |")
    print("|---|---:|---:|---:|")
    for name, mod in single_ops().items():
        plain, sched = _runner(relax.build(mod, target="llvm"), x), _runner(bh.build(mod), x)
        assert relative_error(sched().numpy(), plain().numpy()) <= 1e-5, name
        tp, ts = time_alternately([plain, sched], rounds=rounds, repeat=repeat)
        print(f"| {name} | {tp.median_s * 1e3:.2f} | {ts.median_s * 1e3:.2f} | {tp.median_s / ts.median_s:.2f}x |")


def _ms_table(rounds: int, repeat: int) -> None:
    """Single ops as tvm_cpu regions: the fixed rules against MetaSchedule's search (bench/TVM_CPU.md)."""
    import time

    from byoc_hetero.backends.tvm_cpu import meta_schedule

    ops = single_ops()
    bb = relax.BlockBuilder()
    q = relax.Var("x", relax.TensorType((512, 49, 96), "float32"))
    with bb.function("main", [q]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(q, bb.emit(relax.op.permute_dims(q, [0, 2, 1]))))
        bb.emit_func_output(y)
    ops["q @ k^T (512x49x96)"] = bb.get()
    print(f"MetaSchedule: at most {meta_schedule.TRIALS} candidates, {meta_schedule.SECONDS:g} s per region")
    print("| op (one tvm_cpu region) | dlight ms | meta_schedule ms | dlight / meta_schedule | search s | timed |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, mod in ops.items():
        shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
        x = np.random.default_rng(0).standard_normal(shape).astype("float32")
        meta_schedule.forget()
        fixed = bh.partition(mod, target="tvm_cpu", require_heavy_op=False)
        start = time.time()
        searched = bh.partition(mod, target="tvm_cpu", require_heavy_op=False,
                                options={"tvm_cpu": {"schedule": "meta_schedule"}})
        search_s, records = time.time() - start, list(meta_schedule.stored().values())
        if not records:
            print(f"| {name} | | | | | not a tvm_cpu region |")
            continue
        a, b = _runner(relax.build(fixed, target="llvm"), x), _runner(relax.build(searched, target="llvm"), x)
        assert relative_error(b().numpy(), a().numpy()) <= 1e-5, name
        ta, tb = time_alternately([a, b], rounds=rounds, repeat=repeat)
        print(f"| {name} | {ta.median_s * 1e3:.2f} | {tb.median_s * 1e3:.2f} | {ta.median_s / tb.median_s:.2f}x | "
              f"{search_s:.1f} | {sum(r.trials for r in records)} |")


def _runner(ex: relax.VMExecutable, x: np.ndarray):
    fn = relax.VirtualMachine(ex, tvm.cpu())["main"]
    arg = tvm.runtime.tensor(x)
    return lambda: fn(arg)


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=28, help="the block's height = width (a multiple of 7)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--ops", action="store_true", help="also the single-op table")
    parser.add_argument("--meta-schedule", action="store_true", help="also single ops: dlight vs MetaSchedule")
    parser.add_argument("--no-block", action="store_true", help="leave the Swin block out")
    args = parser.parse_args()
    if not args.no_block:
        _block(args)
    if args.ops:
        _ops_table(args.rounds, args.repeat)
    if args.meta_schedule:
        print(f"{_cpu()}, oneDNN ISA {bh._C.isa()}, TVM threads {tvm.runtime.num_threads()}")
        _ms_table(args.rounds, args.repeat)


def _block(args: argparse.Namespace) -> None:
    """The Swin block built four ways, timed side by side (the module docstring)."""
    import torch

    x = np.random.default_rng(0).standard_normal((1, args.size, args.size, 96)).astype("float32")
    mod, params = bh.from_torch(swin_block(), (torch.from_numpy(x),))
    default = bh.partition(mod, params)
    targets = ["onednn", "tvm_cpu"]
    keep = {c.key: c.target if c.target == "tvm_cpu" else c.default
            for c in candidate_regions(mod, params, targets=targets)}
    tvm_cpu_part = bh.partition(mod, params, target=targets, region_codegen=keep)
    builds = {
        "llvm only": relax.build(bh.bind_params(mod, params), target="llvm"),
        "onednn + plain llvm": relax.build(default, target="llvm"),
        "onednn + scheduled llvm": bh.build(default),
        "onednn + tvm_cpu": bh.build(tvm_cpu_part),
    }
    fns = {name: _runner(ex, x) for name, ex in builds.items()}
    want = fns["llvm only"]().numpy()
    for name, fn in fns.items():
        err = relative_error(fn().numpy(), want)
        assert err <= 1e-4, f"{name}: relative error {err:.2e} against the llvm-only build"
    timings = dict(zip(fns, time_alternately(list(fns.values()), rounds=args.rounds, repeat=args.repeat)))
    base = timings["onednn + plain llvm"].median_s
    print(f"Swin block {args.size}x{args.size}x96, {_cpu()}, oneDNN ISA {bh._C.isa()}, "
          f"TVM threads {tvm.runtime.num_threads()} (TVM_NUM_THREADS; TVM's default counts physical cores)")
    for name in ("onednn + plain llvm", "onednn + tvm_cpu"):
        part = default if name == "onednn + plain llvm" else tvm_cpu_part
        calls = str(part["main"]).count("R.call_dps_packed(")
        print(f"{name}: {calls} region calls; {bh.op_profile(part)}".replace("\n", "; "))
    print("| build | median ms | vs onednn + plain llvm |")
    print("|---|---:|---:|")
    for name, t in timings.items():
        print(f"| {name} | {t.median_s * 1e3:.2f} | {base / t.median_s:.2f}x |")


if __name__ == "__main__":
    main()
