"""``bh.llm.from_gguf`` against llama.cpp on the same GGUF files: each engine's logits error against the float model.

    PYTHONPATH=.:/path/to/llama-cpp-python python3 bench/gguf_check.py [--model smollm_135m] [--small]

A seeded random model of ``bench/gen_engines.py`` (``--small``: 2 layers of width 64) is saved as a Hugging Face
folder and written by ``bench/gguf_write.py`` as F32, Q8_0 and Q4_0 GGUF files. For each of ``--prompts`` prompts
(lengths 3, 8, 13, ...) the last position's logits are computed by transformers on the float weights (the
reference), by our generator on each file (``bh.llm.from_gguf``; Q8_0 / Q4_0 as ``dense_wq`` nodes) and by
llama.cpp (``llama-cpp-python``) on the same file. The error of an engine is max |logits - reference| / max
|reference| over the prompts. The check passes when ours is within ``--slack`` (default 1.1) times llama.cpp's
error at every format (F32: both within 1e-3). Not a test: llama-cpp-python is not a test dependency.
Results: bench/GGUF.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FORMATS = ("f32", "q8_0", "q4_0")


def reference_logits(hf: str, prompts: list[np.ndarray]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        return np.stack([model(torch.from_numpy(p[None])).logits[0, -1].numpy() for p in prompts])


def our_logits(path: str, prompts: list[np.ndarray]) -> np.ndarray:
    import byoc_hetero as bh

    gen = bh.llm.from_gguf(path, max_length=max(p.size for p in prompts))
    rows = []
    for p in prompts:
        rows.append(gen.step(p[None], np.array([0]), np.array([p.size]), gen.new_cache(1))[0])
    return np.stack(rows)


def llama_cpp_logits(path: str, prompts: list[np.ndarray], threads: int) -> np.ndarray:
    from llama_cpp import Llama

    n = max(p.size for p in prompts)
    llm = Llama(model_path=path, n_ctx=max(n, 8), n_batch=n, n_ubatch=n, n_threads=threads,
                n_threads_batch=threads, logits_all=False, verbose=False)
    rows = []
    for p in prompts:
        llm.reset()
        llm.eval(p.tolist())
        rows.append(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),)).copy())
    return np.stack(rows)


def machine() -> str:
    """lscpu's model name and oneDNN's ISA (the figures are errors, not timings)."""
    import subprocess

    import byoc_hetero as bh

    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "?")
    return f"CPU: {model}; oneDNN ISA: {bh._C.isa()}"


def error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    import json

    from gen_engines import prompt_ids, save_model
    from gguf_write import write_gguf

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm_135m", choices=("smollm_135m", "qwen2_0_5b", "llama_1b"))
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slack", type=float, default=1.1)
    ap.add_argument("--keep", default=None, help="folder for the model and files (default: a temporary one)")
    args = ap.parse_args()
    folder = args.keep or tempfile.mkdtemp(prefix="gguf_check_")
    hf = os.path.join(folder, "hf")
    cfg = save_model(args.model, args.small, hf) if not os.path.exists(os.path.join(hf, "config.json")) else None
    cfg = cfg or json.load(open(os.path.join(hf, "config.json")))
    ids = prompt_ids(cfg["vocab_size"], 3 + 5 * (args.prompts - 1))
    prompts = [ids[:3 + 5 * i] for i in range(args.prompts)]
    ref = reference_logits(hf, prompts)
    ok = True
    print(machine())
    print(f"{args.model}{' (small)' if args.small else ''}: {len(prompts)} prompts of {[p.size for p in prompts]} "
          "tokens; error = max |logits - transformers f32| / max |transformers f32|")
    print(f"{'format':8} {'ours':>10} {'llama.cpp':>10} {'ours/llama.cpp':>15} {'ours vs llama.cpp':>18}")
    for fmt in FORMATS:
        path = os.path.join(folder, f"m.{fmt}.gguf")
        if not os.path.exists(path):
            write_gguf(hf, path, fmt)
        ours, cpp = our_logits(path, prompts), llama_cpp_logits(path, prompts, args.threads)
        e_ours, e_cpp = error(ours, ref), error(cpp, ref)
        passed = max(e_ours, e_cpp) <= 1e-3 if fmt == "f32" else e_ours <= args.slack * e_cpp
        ok &= passed
        print(f"{fmt:8} {e_ours:10.2e} {e_cpp:10.2e} {e_ours / max(e_cpp, 1e-30):15.3f} {error(ours, cpp):18.2e}"
              f"{'' if passed else '  FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
