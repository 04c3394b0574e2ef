"""A llama.cpp Q4_K_M file (made by llama.cpp's own quantizer) through ``bh.llm.from_gguf`` against llama.cpp on
the same file: logits against transformers' float model, greedy tokens, then decode tokens/s side by side.

    PYTHONPATH=. python3 bench/gguf_kquant.py KEEP [--model smollm_135m] [--threads 2] [--new 64]

``KEEP/MODEL`` (default ``smollm_135m``) holds ``hf`` (a seeded random model of ``bench/generate.py``:
``smollm_135m``, ``qwen2_0_5b``, ``llama_1b``) and its ``model.f32.gguf``; ``model.q4_k_m.gguf`` is made there
once (``gen_engines.gguf_file``: llama.cpp's ``llama_model_quantize``, LLAMA_FTYPE_MOSTLY_Q4_K_M). SmolLM's and
Qwen2.5-0.5B's rows (576, 896) do not split into K-quants' super-blocks of 256, so llama.cpp falls back to other
types for most tensors; Llama-3.2-1B's (2048, 8192) do: its file is Q4_K / Q6_K. llama-cpp-python is imported
from the interpreter's own packages (or PYTHONPATH). Results: bench/GGUF.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_engines import LlamaCpp, OursGguf, gguf_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keep")
    ap.add_argument("--model", default="smollm_135m", help="the folder under KEEP (hf and model.f32.gguf)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    folder = os.path.join(args.keep, args.model)
    hf = os.path.join(folder, "hf")
    path = gguf_file(hf, folder, "q4_k_m")
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, model.config.vocab_size, size=n) for n in (8, 32, 96)]
    with torch.no_grad():
        ref = [model(torch.from_numpy(p[None])).logits[0, -1].numpy() for p in prompts]
    del model
    start = time.time()
    ours = OursGguf(path, "q4_k_m", args.threads, 256)
    print(f"our build: {time.time() - start:.0f} s; weights {ours.gen.weights}")
    lc = LlamaCpp(path, "q4_k_m", args.threads, 256)
    for p, r in zip(prompts, ref):
        a, b, s = ours.logits(p), lc.logits(p), np.abs(r).max()
        print(f"prompt {p.size}: error vs float ours {np.abs(a - r).max() / s:.4f}, llama.cpp {np.abs(b - r).max() / s:.4f}"
              f"; ours vs llama.cpp {np.abs(a - b).max() / np.abs(b).max():.4f}; argmax {a.argmax()} {b.argmax()}")
    ta, tb = ours.generate(prompts[1], 32), lc.generate(prompts[1], 32)
    print("greedy 32 tokens: first", next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta)), "equal")
    for rnd in range(args.rounds):
        for name, eng in (("ours", ours), ("llama.cpp", lc)):
            # the best of three prompt-and-one-token runs and of two with the new tokens: one slow moment (a
            # loaded machine) can no longer make the difference negative
            first = min(_seconds(eng.generate, prompts[0], 1) for _ in range(3))
            whole = min(_seconds(eng.generate, prompts[0], args.new + 1) for _ in range(2))
            print(f"round {rnd + 1} {name}: decode {args.new / (whole - first):.1f} tok/s ({args.threads} threads)")


def _seconds(fn, *args) -> float:
    """Wall seconds of one call of ``fn(*args)``."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
