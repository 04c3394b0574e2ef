"""LLM-shaped check: a Llama-family decoder with a dynamic sequence length, one build, several lengths.

    python bench/llm.py --markdown bench/LLM.md                  # SmolLM-135M sizes, S = 7, 128, 512
    python bench/llm.py --small --seqs 7,32 --rounds 1            # scaled-down config: a smoke run

The model is ``bench/zoo_models.py``'s ``smollm_135m`` (transformers' LlamaModel with SmolLM-135M's
sizes: 30 layers of width 576, grouped-query attention 9 / 3 heads, RMSNorm, RoPE, SiLU MLP; seeded random
weights; ``input_ids`` in, last hidden state out, no KV cache: a prefill). It is exported once with
``torch.export.Dim("S", max=2048)`` on the sequence:

* ours: ``bh.from_torch(..., dynamic_shapes=...)``, one ``bh.partition`` and one ``relax.build`` serving every
  length (the region plans each new S once; a second call of the same S reuses the plan);
* ours_onnx: the same through ``bh.from_onnx`` of the dynamic ONNX file the other two run;
* ONNX Runtime (CPU provider, all graph optimizations) and OpenVINO (CPU, ``INFERENCE_PRECISION_HINT=f32``,
  latency hint, one stream) on the file ``torch.onnx.export`` writes with its defaults (torch 2.13:
  dynamo, opset 20) with the same dynamic S.

Every output is compared with torch eager at each length. Timing: each framework in its own process per
round (``--rounds`` interleaved rounds), ``--threads`` threads each (OMP / TVM / BYOC_HETERO / MKL
variables, ``intra_op_num_threads``, ``INFERENCE_NUM_THREADS``); per length the median over the rounds of
each process's median call latency. Not part of the tests: it asserts nothing, it reports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import _spawn, _timed, fmt_ms, machine  # noqa: E402
from zoo_models import _token_ids, smollm_135m  # noqa: E402

FRAMEWORKS = ("ours", "ours_onnx", "ort", "openvino")
OURS = ("ours", "ours_onnx")
LABELS = {"ours": "ours (from_torch, one build)", "ours_onnx": "ours (from_onnx, one build)", "ort": "ONNX Runtime",
          "openvino": "OpenVINO f32"}
MAX_SEQ = 2048


def _paths(workdir: str) -> dict[str, str]:
    return {"onnx": os.path.join(workdir, "llama.onnx"), "lib": os.path.join(workdir, "llama.so"),
            "lib_onnx": os.path.join(workdir, "llama_onnx.so"),
            "out": os.path.join(workdir, "out_{fw}_{seq}.npy"), "ref": os.path.join(workdir, "ref_{seq}.npy")}


def _model(small: bool):
    return smollm_135m(small=small, seq=16)


def compile_worker(workdir: str, small: bool, seqs: list[int]) -> dict:
    """Torch references, the dynamic ONNX export, and our one build (regions, ops on llvm)."""
    import torch
    import tvm
    from tvm import relax

    import byoc_hetero as bh

    p = _paths(workdir)
    zm = _model(small)
    vocab = zm.module.model.config.vocab_size
    for seq in seqs:
        with torch.inference_mode():
            np.save(p["ref"].format(seq=seq), zm.module(_token_ids(vocab, seq)).numpy())
    dim = torch.export.Dim("S", max=MAX_SEQ)
    info: dict = {"params_m": sum(t.numel() for t in zm.module.parameters()) / 1e6, "vocab": vocab}
    t0 = time.perf_counter()
    torch.onnx.export(zm.module, zm.inputs, p["onnx"], input_names=["input_ids"], output_names=["y"],
                      dynamic_shapes=({1: dim},))
    info["export_s"] = time.perf_counter() - t0
    for fw, lib, load in (("ours", p["lib"], lambda: bh.from_torch(zm.module, zm.inputs, dynamic_shapes=({1: dim},))),
                          ("ours_onnx", p["lib_onnx"], lambda: bh.from_onnx(p["onnx"]))):
        t0 = time.perf_counter()
        mod, params = load()
        part = bh.partition(mod, params)
        rep = bh.report(part)
        info[f"regions_{fw}"] = len(rep.regions)
        info[f"llvm_ops_{fw}"] = sorted({fb.op for fb in rep.fallbacks})
        relax.build(part, target="llvm").export_library(lib)
        info[f"compile_s_{fw}"] = time.perf_counter() - t0
    return info


def time_worker(fw: str, workdir: str, threads: int, seqs: list[int], vocab: int, min_time: float) -> dict:
    """Per length: the median latency of one call on ``fw`` (the output saved for the error check)."""
    p = _paths(workdir)
    if fw in OURS:
        import tvm
        from tvm import relax

        import byoc_hetero  # noqa: F401 - registers the loader of our region modules

        vm = relax.VirtualMachine(tvm.runtime.load_module(p["lib" if fw == "ours" else "lib_onnx"]), tvm.cpu())

        def make(ids):
            arg = tvm.runtime.tensor(ids)
            return lambda: vm["main"](arg), lambda out: (out if hasattr(out, "numpy") else out[0]).numpy()
    elif fw == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(p["onnx"], so, providers=["CPUExecutionProvider"])

        def make(ids):
            return lambda: sess.run(None, {"input_ids": ids}), lambda out: out[0]
    else:
        import openvino as ov

        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(threads),
                  "INFERENCE_PRECISION_HINT": "f32"}
        request = ov.Core().compile_model(p["onnx"], "CPU", config).create_infer_request()

        def make(ids):
            return (lambda: request.infer({"input_ids": ids}),
                    lambda _: np.array(request.get_output_tensor(0).data))
    result = {}
    for seq in seqs:
        call, read = make(_token_ids(vocab, seq).numpy())
        t0 = time.perf_counter()
        np.save(p["out"].format(fw=fw, seq=seq), read(call()))
        first = time.perf_counter() - t0  # a new S: our region plans it here (once per length)
        t0 = time.perf_counter()
        call()
        slow = time.perf_counter() - t0 > 0.5
        times = _timed(call, min_time=min_time, min_iters=3 if slow else 10, max_iters=5 if slow else 200,
                       warmup=0 if slow else 2)
        result[str(seq)] = {"median_s": float(np.median(times)), "first_s": first, "iters": len(times)}
    return result


def _error(workdir: str, fw: str, seq: int) -> float | None:
    p = _paths(workdir)
    out_file = p["out"].format(fw=fw, seq=seq)
    if not os.path.exists(out_file):
        return None
    out, ref = np.load(out_file), np.load(p["ref"].format(seq=seq))
    if out.shape != ref.shape:
        return None
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def render(args, info: dict, timings: dict, workdir: str) -> list[str]:
    seqs = args.seqs
    lines = [f"Machine: {machine()}", "",
             f"Model: transformers LlamaModel, {'scaled down (small)' if args.small else 'SmolLM-135M sizes'}, "
             f"{info['params_m']:.0f} M parameters, seeded random weights, batch 1, float32; dynamic sequence "
             f"`Dim(\"S\", max={MAX_SEQ})`. "
             + " ".join(f"{LABELS[fw]}: {info[f'regions_{fw}']} region(s), compiled in {info[f'compile_s_{fw}']:.0f} s; "
                        f"ops left on llvm: {', '.join(info[f'llvm_ops_{fw}']) or 'none'}." for fw in OURS)
             + f" {args.threads} threads, {args.rounds} interleaved round(s), median of per-process medians.", "",
             "| S | " + " | ".join(f"{LABELS[fw]} ms" for fw in FRAMEWORKS) + " | "
             + " | ".join(f"{fw} / {other}" for fw in OURS for other in ("ORT", "OpenVINO f32")) + " | "
             + " | ".join(f"error {fw}" for fw in FRAMEWORKS) + " |",
             "|---|" + "---|" * (2 * len(FRAMEWORKS) + 2 * len(OURS))]
    for seq in seqs:
        med = {}
        for fw in FRAMEWORKS:
            runs = [r[str(seq)]["median_s"] for r in timings.get(fw, []) if str(seq) in r]
            med[fw] = float(np.median(runs)) if runs else None
        ratio = [med[a] / med[b] if med[a] and med[b] else None for a in OURS for b in ("ort", "openvino")]
        errs = []
        for fw in FRAMEWORKS:
            e = _error(workdir, fw, seq)
            errs.append("—" if e is None else f"{e:.1e}")
        lines.append(f"| {seq} | " + " | ".join(fmt_ms(med[fw]) for fw in FRAMEWORKS) + " | "
                     + " | ".join("—" if r is None else f"{r:.2f}" for r in ratio)
                     + " | " + " | ".join(errs) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--seqs", default="7,128,512", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=2.0)
    ap.add_argument("--markdown", help="append the table to this file")
    ap.add_argument("--workdir")
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile:
        print(json.dumps(compile_worker(args.workdir, args.small, args.seqs)))
        return 0
    if args.worker:
        print(json.dumps(time_worker(args.worker, args.workdir, args.threads, args.seqs, args.vocab, args.min_time)))
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="byoc_llm_")
    common = ["--workdir", workdir, "--seqs", ",".join(map(str, args.seqs)), "--min-time", str(args.min_time)]
    common += ["--small"] if args.small else []
    script = os.path.abspath(__file__)
    info = _spawn(["--compile", *common], args.threads, timeout=3600, script=script)
    if "error" in info:
        print(info["error"], file=sys.stderr)
        return 1
    print("compiled: " + ", ".join(f"{fw} {info[f'regions_{fw}']} region(s) in {info[f'compile_s_{fw}']:.0f} s"
                                   for fw in OURS), file=sys.stderr)
    timings: dict[str, list[dict]] = {}
    for rnd in range(args.rounds):
        for fw in FRAMEWORKS:
            r = _spawn(["--worker", fw, "--threads", str(args.threads), "--vocab", str(info["vocab"]), *common],
                       args.threads, timeout=3600, script=script)
            print(f"round {rnd + 1} {fw}: {r}", file=sys.stderr)
            if "error" not in r:
                timings.setdefault(fw, []).append(r)
    lines = render(args, info, timings, workdir)
    print("\n".join(lines))
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
