"""Issue 37: is ``from_hf(weights="int8" | "int4", group_size=32)`` llama.cpp's Q8_0 / Q4_0, and is its error
within llama.cpp's at the same format on the same weights?

Two parts, one model in memory at a time (each ``--engine`` a process of its own); ``--format`` ``q8_0``
(int8, the default) or ``q4_0`` (int4), the file ``model.<format>.gguf`` beside the transformers folder:

* ``--compare``: tensor by tensor, the codes and float16 scales :func:`quantize_matrix` writes for each
  dense of a transformers folder (blocks of 32, float16 scales, as ``from_hf`` quantizes) under both
  roundings (``nearest``: on the stored scale; ``gguf``: llama.cpp's rule) against the same tensor's blocks
  in the GGUF file converted from it (``block_codes``; a ``llama`` file's q / k rows put back in
  transformers' order). Prints counts (JSON).
* ``--engine ref|hf-nearest|hf-gguf|file|llama``: logits at every position of bench/generate.py's prompt (its
  seeded ids), saved to ``--out``: transformers float32 (``ref``), ours ``from_hf(weights=..., group_size=32,
  rounding=...)`` with either rounding, ours ``from_gguf`` on the file, llama.cpp itself (llama_cpp_python,
  ``logits_all=True``). Ours are teacher-forced one token a step (decode steps: every position's logits),
  and the prompt in one step for the last position (the bench's prefill).
* ``--report`` prints, for each saved engine against ``ref``: ``last`` (generate.py's column: max
  |l - l_ref| / max |l_ref| at the last position), ``mean`` (that per position, averaged), ``rms``
  (sqrt(mean (l - l_ref)^2 / mean l_ref^2) over all positions and logits); given several ``--out`` folders
  (comma-separated: one prompt each, ``--seed``), a row per prompt and the mean rms of each engine and its
  ratio to llama.cpp's. ``--seed N``: another seeded prompt instead of the bench's.

    PYTHONPATH=. python3 bench/q8_0_same.py --compare --format q4_0
    for e in ref hf-nearest hf-gguf file llama; do PYTHONPATH=. python3 bench/q8_0_same.py --engine $e; done
    PYTHONPATH=. python3 bench/q8_0_same.py --report
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

HF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}
BITS = {"q8_0": 8, "q4_0": 4}
ENGINES = ("hf-nearest", "hf-gguf", "file", "llama")


def _file_codes(f, g: str, spec):
    """The file's codes of tensor ``g`` in transformers' row order (a ``llama`` file's q / k rows undone)."""
    from byoc_hetero.llm.gguf import _permuted, block_codes

    codes = block_codes(f, g)
    if spec.family == "llama" and g.split(".")[-2] in ("attn_q", "attn_k"):
        codes = _permuted(codes, spec.heads if "attn_q" in g else spec.kv_heads)
    return codes


def compare(hf: str, gguf_path: str, bits: int) -> dict:
    """Counts of codes / scales that differ from the file's under each rounding, and each one's weight
    squared error (and the file's, and the weights' squared sum), over every blocked tensor."""
    from safetensors import safe_open

    from byoc_hetero.llm.gguf import GgufFile, gguf_spec
    from byoc_hetero.quant.weight_only import _unpack, dequantize_codes, quantize_matrix

    f = GgufFile(gguf_path)
    spec = gguf_spec(f)
    names = {"token_embd.weight": "model.embed_tokens.weight"}
    names.update({f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight" for i in range(spec.layers)
                  for g, h in HF_NAMES.items()})
    tot = {"weights": 0, "blocks": 0, "file_sq_err": 0.0, "sq_w": 0.0}
    with safe_open(os.path.join(hf, "model.safetensors"), "numpy") as st:
        for g, h in names.items():
            w = st.get_tensor(h).astype(np.float32)
            ref = _file_codes(f, g, spec)
            rq, rs = _unpack(ref), ref.scales.reshape(w.shape[0], -1).view(np.uint16)
            tot["weights"] += w.size
            tot["blocks"] += rs.size
            tot["file_sq_err"] += float(((dequantize_codes(ref).astype(np.float64) - w) ** 2).sum())
            tot["sq_w"] += float((w.astype(np.float64) ** 2).sum())
            for rule in ("nearest", "gguf"):
                ours = quantize_matrix(w, bits, 32, scale_dtype="float16", rounding=rule)
                tot[f"{rule}_codes_differ"] = tot.get(f"{rule}_codes_differ", 0) + int((_unpack(ours) != rq).sum())
                tot[f"{rule}_scales_differ"] = tot.get(f"{rule}_scales_differ", 0) + int(
                    (ours.scales.view(np.uint16) != rs).sum())
                err = float(((dequantize_codes(ours).astype(np.float64) - w) ** 2).sum())
                tot[f"{rule}_sq_err"] = tot.get(f"{rule}_sq_err", 0.0) + err
    return tot


def logits_ours(args, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import byoc_hetero as bh

    n = ids.shape[0]
    if args.engine == "file":
        gen = bh.llm.from_gguf(args.gguf, max_length=n + 1)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
        gen = bh.llm.from_hf(model, max_length=n + 1, weights=f"int{BITS[args.format]}", group_size=32,
                             rounding=args.engine.split("-")[1])
        del model
    print(f"built {gen.weights}", flush=True)
    one = np.array([1], np.int64)
    prefill = np.array(gen.step(ids[None], np.zeros(1, np.int64), np.array([n], np.int64), gen.new_cache(1)))[0]
    cache, rows = gen.new_cache(1), []
    for i in range(n):
        rows.append(np.array(gen.step(ids[None, i:i + 1], np.array([i], np.int64), one, cache))[0])
    return np.stack(rows), prefill


def logits_of(args, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    if args.engine == "ref":
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
        with torch.no_grad():
            return model(torch.from_numpy(ids[None])).logits[0].numpy(), None
    if args.engine == "llama":
        from llama_cpp import Llama

        llm = Llama(model_path=args.gguf, n_ctx=ids.shape[0] + 8, n_threads=args.threads, n_batch=ids.shape[0],
                    logits_all=True, verbose=False)
        llm.eval(ids.tolist())
        return np.array(llm.scores[:ids.shape[0]], dtype=np.float32), None
    return logits_ours(args, ids)


def metrics(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    per = np.abs(got - ref).max(1) / np.abs(ref).max(1)
    return {"last": float(per[-1]), "mean": float(per.mean()),
            "rms": float(np.sqrt(((got - ref) ** 2).mean() / (ref ** 2).mean()))}


def _saved(out: str, engine: str, fmt: str) -> str:
    return os.path.join(out, "ref.npz" if engine == "ref" else f"{engine}.{fmt}.npz")


def report(outs: list[str], fmt: str) -> None:
    """One markdown row per prompt (folder) and engine; with several prompts, each engine's mean rms and its
    ratio to llama.cpp's."""
    print(f"{fmt}: | prompt | engine | last (decode steps) | last (one prefill step) | mean over positions "
          "| rms (all positions, logits) |")
    print("|---|---|---|---|---|---|")
    rms: dict[str, list[float]] = {}
    for out in outs:
        ref = np.load(_saved(out, "ref", fmt))["all"]
        for e in ENGINES:
            p = _saved(out, e, fmt)
            if not os.path.exists(p):
                continue
            z = np.load(p)
            m = metrics(z["all"], ref)
            pre = metrics(z["prefill"][None], ref[-1:])["last"] if "prefill" in z else float("nan")
            rms.setdefault(e, []).append(m["rms"])
            print(f"| {os.path.basename(out.rstrip('/'))} | {e} | {m['last']:.3g} | {pre:.3g} | {m['mean']:.3g} "
                  f"| {m['rms']:.4g} |")
    if len(outs) > 1:
        base = np.mean(rms["llama"]) if len(rms.get("llama", [])) == len(outs) else float("nan")
        for e, v in rms.items():
            print(f"mean rms {e}: {np.mean(v):.4g} over {len(v)} prompts ({np.mean(v) / base:.3f}x llama.cpp)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf", default="/tmp/gen/qwen2_0_5b/hf")
    ap.add_argument("--format", choices=tuple(BITS), default="q8_0")
    ap.add_argument("--gguf", default=None, help="default: model.<format>.gguf beside --hf")
    ap.add_argument("--out", default="/tmp/q8_0_same", help="--report: several, comma-separated (one prompt each)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--seed", type=int, default=None, help="another seeded prompt instead of the bench's")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--engine", choices=("ref",) + ENGINES)
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    args.gguf = args.gguf or os.path.join(os.path.dirname(os.path.abspath(args.hf)), f"model.{args.format}.gguf")
    if args.compare:
        print(json.dumps(compare(args.hf, args.gguf, BITS[args.format])))
    if args.engine:
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gen_engines import prompt_ids

        with open(os.path.join(args.hf, "config.json")) as fh:
            vocab = json.load(fh)["vocab_size"]
        ids = prompt_ids(vocab, args.prompt)
        if args.seed is not None:  # another prompt (the spread of one prompt's figures): ids from the bench's lowest up
            ids = np.random.default_rng(args.seed).integers(ids.min(), vocab, size=args.prompt, dtype=np.int64)
        t = time.time()
        all_, prefill = logits_of(args, ids)
        os.makedirs(args.out, exist_ok=True)
        arrays = {"all": all_} if prefill is None else {"all": all_, "prefill": prefill}
        np.savez(_saved(args.out, args.engine, args.format), **arrays)
        print(f"{args.engine}: {all_.shape} in {time.time() - t:.0f} s", flush=True)
    if args.report:
        report(args.out.split(","), args.format)


if __name__ == "__main__":
    main()
