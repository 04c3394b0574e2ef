"""Issue 37: is ``from_hf(weights="int8", group_size=32)`` llama.cpp's Q8_0, and is its error within Q8_0's?

Two parts, one model in memory at a time (each ``--engine`` a process of its own):

* ``--compare``: tensor by tensor, the codes and float16 scales :func:`quantize_matrix` writes for each
  dense of a transformers folder (``group_size=32``, float16 scales, as ``from_hf`` quantizes) against
  the same tensor's blocks in a Q8_0 GGUF file converted from it (``block_codes``); also llama.cpp's
  own rule redone in numpy (``d = amax / 127`` in float32, codes ``roundf(x * (1 / d))``, ``d`` stored
  float16) against the file. Prints counts (JSON).
* ``--engine ref|hf-g32|gguf|llama|hf-g32-llama-rule``: logits at every position of bench/generate.py's
  prompt (its seeded ids), saved to ``--out``: transformers float32 (``ref``), ours
  ``from_hf(weights="int8", group_size=32)``, ours ``from_gguf`` on the Q8_0 file, llama.cpp itself
  (llama_cpp_python, ``logits_all=True``), and, as an experiment, ``from_hf`` with the quantizer's int8
  blocks of 32 swapped for llama.cpp's rule (``hf-g32-llama-rule``: the file's codes, HF's float32 RoPE
  frequencies). Ours are teacher-forced one token a step (decode steps: every position's logits), and
  the prompt in one step for the last position (the bench's prefill).
* ``--report`` prints, for each saved engine against ``ref``: ``last`` (generate.py's column: max
  |l - l_ref| / max |l_ref| at the last position), ``mean`` (that per position, averaged), ``rms``
  (sqrt(mean (l - l_ref)^2 / mean l_ref^2) over all positions and logits). ``--seed N``: another seeded
  prompt instead of the bench's.

    PYTHONPATH=. python3 bench/q8_0_same.py --compare
    for e in ref hf-g32 gguf llama hf-g32-llama-rule; do PYTHONPATH=. python3 bench/q8_0_same.py --engine $e; done
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


def llama_cpp_q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes [N, K] int8, scales [N, K / 32] float16) as llama.cpp's quantize_row_q8_0_ref / gguf-py write them."""
    b = w.astype(np.float32).reshape(w.shape[0], -1, 32)
    d = np.abs(b).max(2, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    x = b * inv
    q = np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))  # roundf: half away from zero
    return q.reshape(w.shape).astype(np.int8), d[:, :, 0].astype(np.float16)


def compare(hf: str, gguf_path: str) -> dict:
    from safetensors.numpy import load_file

    from byoc_hetero.llm.gguf import GgufFile, block_codes
    from byoc_hetero.quant.weight_only import quantize_matrix

    tensors, f = load_file(os.path.join(hf, "model.safetensors")), GgufFile(gguf_path)
    layers = 1 + max(int(n.split(".")[1]) for n in f.tensors if n.startswith("blk."))
    names = {"token_embd.weight": "model.embed_tokens.weight"}
    names.update({f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight" for i in range(layers)
                  for g, h in HF_NAMES.items()})
    tot = {k: 0 for k in ("weights", "blocks", "ours_codes_differ", "ours_scales_differ", "llama_rule_codes_differ",
                          "llama_rule_scales_differ", "ours_sq_err", "file_sq_err", "sq_w")}
    for g, h in names.items():
        w = tensors[h].astype(np.float32)
        ref, ours = block_codes(f, g), quantize_matrix(w, 8, 32, scale_dtype="float16")
        rq, oq = ref.codes.reshape(w.shape), ours.codes.reshape(w.shape)
        rs, os_ = np.asarray(ref.scales).reshape(w.shape[0], -1), np.asarray(ours.scales).reshape(w.shape[0], -1)
        lq, ls = llama_cpp_q8_0(w)
        tot["weights"] += w.size
        tot["blocks"] += rs.size
        tot["ours_codes_differ"] += int((rq != oq).sum())
        tot["ours_scales_differ"] += int((rs != os_).sum())
        tot["llama_rule_codes_differ"] += int((rq != lq).sum())
        tot["llama_rule_scales_differ"] += int((rs != ls).sum())
        b = w.reshape(w.shape[0], -1, 32).astype(np.float64)
        for key, q, s in (("ours_sq_err", oq, os_), ("file_sq_err", rq, rs)):
            deq = q.reshape(b.shape).astype(np.float64) * s.astype(np.float64)[:, :, None]
            tot[key] += float(((deq - b) ** 2).sum())
        tot["sq_w"] += float((b ** 2).sum())
    return tot


def _patch_llama_rule() -> None:
    """Make quantize_matrix's int8 blocks of 32 use :func:`llama_cpp_q8_0` (the experiment's codes)."""
    from byoc_hetero.quant import weight_only

    plain = weight_only._quantize_rows

    def rows(w, first, bits, block, zero_points, scale_dtype):
        if bits != 8 or block != 32 or zero_points or scale_dtype != "float16":
            return plain(w, first, bits, block, zero_points, scale_dtype)
        q, d = llama_cpp_q8_0(w)
        return q, np.where(d != 0, d, np.float16(1)), None

    weight_only._quantize_rows = rows


def logits_ours(args, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import byoc_hetero as bh

    n = ids.shape[0]
    if args.engine == "gguf":
        gen = bh.llm.from_gguf(args.gguf, max_length=n + 1)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        if args.engine == "hf-g32-llama-rule":
            _patch_llama_rule()

        model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
        gen = bh.llm.from_hf(model, max_length=n + 1, weights="int8", group_size=32)
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


def report(out: str) -> None:
    ref = np.load(os.path.join(out, "ref.npz"))["all"]
    print("| engine | last (decode steps) | last (one prefill step) | mean over positions "
          "| rms (all positions, logits) |")
    print("|---|---|---|---|---|")
    for e in ("hf-g32", "gguf", "llama", "hf-g32-llama-rule"):
        p = os.path.join(out, f"{e}.npz")
        if not os.path.exists(p):
            continue
        z = np.load(p)
        m = metrics(z["all"], ref)
        pre = metrics(z["prefill"][None], ref[-1:])["last"] if "prefill" in z else float("nan")
        print(f"| {e} | {m['last']:.3g} | {pre:.3g} | {m['mean']:.3g} | {m['rms']:.3g} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf", default="/tmp/gen/qwen2_0_5b/hf")
    ap.add_argument("--gguf", default="/tmp/gen/qwen2_0_5b/model.q8_0.gguf")
    ap.add_argument("--out", default="/tmp/q8_0_same")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--seed", type=int, default=None, help="another seeded prompt instead of the bench's")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--engine", choices=("ref", "hf-g32", "gguf", "llama", "hf-g32-llama-rule"))
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    if args.compare:
        print(json.dumps(compare(args.hf, args.gguf)))
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
        np.savez(os.path.join(args.out, f"{args.engine}.npz"), **arrays)
        print(f"{args.engine}: {all_.shape} in {time.time() - t:.0f} s", flush=True)
    if args.report:
        report(args.out)


if __name__ == "__main__":
    main()
