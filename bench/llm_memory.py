"""Where the resident memory of ``bh.llm`` generation goes, stage by stage (issue 36's memory target).

    PYTHONPATH=. python bench/llm_memory.py --model smollm_135m --threads 2 [--contention] [--weights int8]

One fresh process: imports, a seeded random transformers model of the named sizes (gen_engines.py),
``bh.llm.from_hf`` (``--weights``, f32 by default; max_length = prompt + new), the transformers model deleted, then a
generation (a prefill of ``--prompt`` tokens and ``--new`` decode steps); with ``--contention`` a second
one on the 1-thread contention plans (forced: what a busy machine makes). After each stage: VmRSS and
VmHWM (MiB), and at the end the regions' prepared-weight bytes (get_runtime_info's shared_bytes).
Prints one Markdown table. Memory, not time: the figures hold on a loaded machine too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def status() -> tuple[int, int]:
    """(VmRSS, VmHWM) in MiB."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                got[line.split(":")[0]] = int(line.split()[1]) // 1024
    return got["VmRSS"], got["VmHWM"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm_135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--contention", action="store_true", help="then generate on the 1-thread contention plans")
    ap.add_argument("--weights", default="f32", help="from_hf's weights: f32 (default), int8, int4")
    args = ap.parse_args()
    os.environ.setdefault("BYOC_HETERO_ADAPT_THREADS", "off")
    rows = []
    import numpy as np
    import torch
    import transformers

    import byoc_hetero as bh
    from byoc_hetero import _C
    from byoc_hetero._relax import region_modules
    from gen_engines import model_config, prompt_ids

    _C.set_num_threads(args.threads)
    rows.append(("imports (torch, transformers, TVM, oneDNN)", *status()))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(model_config(args.model, small=False)).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rows.append(("+ the transformers model", *status()))
    gen = bh.llm.from_hf(model, max_length=args.prompt + args.new, weights=args.weights)
    rows.append((f"`from_hf` done ({args.weights})", *status()))
    vocab = model.config.vocab_size
    del model
    gc.collect()
    rows.append(("transformers model deleted", *status()))
    ids = np.asarray(prompt_ids(vocab, args.prompt))[None]
    gen.generate(ids, args.new)
    rows.append((f"generate ({args.prompt} + {args.new}, {args.threads} threads)", *status()))
    if args.contention:
        _C.set_thread_adaptation("reduced")
        gen.generate(ids, args.new)
        rows.append(("again on the 1-thread contention plans", *status()))
    info = [json.loads(m["get_runtime_info"]()) for m in region_modules(gen._executable)]
    print(f"{args.model}: {weights / 2**20:.0f} MiB of f32 weights; prepared weights "
          f"{sum(i['shared_bytes'] for i in info) / 2**20:.0f} MiB; contention plans "
          f"{[i['contention_plans'] for i in info]}; oneDNN {_C.onednn_version()} ISA {_C.isa()}\n")
    print("| stage | VmRSS MiB | VmHWM MiB |\n|---|---|---|")
    for name, rss, hwm in rows:
        print(f"| {name} | {rss} | {hwm} |")


if __name__ == "__main__":
    main()
