"""Same-process A/B of the lookups' page hand-back (``BYOC_HETERO_RELEASE_LOOKUP_PAGES``, cpp/weights.h LookupPages).

    PYTHONPATH=.:bench python3 bench/lookup_pages.py --model smollm_135m --threads 2 --rounds 5

Two generators of one seeded random model (gen_engines.py's sizes) in one process, built with the variable at
``1`` (the lookups read a table mapped from the generator's weights file 16 rows at a time and hand its pages
back after each 16) and at ``0`` (the pages stay: on Linux 6.18 each row's fault maps its whole page-cache
folio, up to 2 MiB). Rounds interleave the two: a prefill of ``--prompt`` ids, then ``--new`` decode steps fed
with distinct ids (as text's tokens are; a random model's greedy tokens repeat), each round's ids new. Prints
the median prefill and decode times of each and the weights file's resident MiB after the rounds (the pages of
the mapping present in this process, /proc/self/pagemap), then the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
VARIABLE = "BYOC_HETERO_RELEASE_LOOKUP_PAGES"


def present_mib(array) -> float:
    """MiB of ``array``'s pages mapped in this process (/proc/self/pagemap's present bit)."""
    import numpy as np

    first, last = array.ctypes.data // 4096, (array.ctypes.data + array.nbytes + 4095) // 4096
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first) * 8), dtype=np.uint64)
    return int((entries >> np.uint64(63)).sum()) * 4096 / 2**20


def one_round(gen, rng, vocab: int, prompt: int, new: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds per token) of one prefill and ``new`` decode steps on fresh ids."""
    import numpy as np

    cache = gen.new_cache(1)
    ids = rng.integers(3, vocab, (1, prompt))
    start = time.perf_counter()
    gen.step(ids, np.zeros(1, "int64"), np.array([prompt]), cache)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for t in range(new):
        gen.step(rng.integers(3, vocab, (1, 1)), np.array([prompt + t]), np.array([1]), cache)
    return prefill, (time.perf_counter() - start) / max(new, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm_135m")
    ap.add_argument("--weights", default="f32", help="from_hf's weights: f32, int8, int4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("BYOC_HETERO_ADAPT_THREADS", "off")
    import numpy as np
    import torch
    import transformers

    import byoc_hetero as bh
    from byoc_hetero import _C
    from gen_engines import model_config

    _C.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(model_config(args.model, small=False)).eval()
    vocab = model.config.vocab_size
    gens = {}
    for value in ("1", "0"):
        os.environ[VARIABLE] = value  # read when the lookup kernels are built: at each generator's first plans
        gens[value] = bh.llm.from_hf(model, max_length=args.prompt + args.new, weights=args.weights)
        one_round(gens[value], np.random.default_rng(1), vocab, args.prompt, 1)  # plans made, pages released once
    del model
    bh.llm.return_freed_heap()
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in gens}
    for r in range(args.rounds):
        for value in (("1", "0") if r % 2 == 0 else ("0", "1")):
            times[value].append(one_round(gens[value], np.random.default_rng(100 + r), vocab, args.prompt, args.new))
    print(f"{args.model} {args.weights}, {args.threads} threads, prompt {args.prompt}, {args.new} decode steps, "
          f"{args.rounds} interleaved rounds; oneDNN {_C.onednn_version()} ISA {_C.isa()}\n")
    print(f"| {VARIABLE} | prefill ms (median) | decode ms/token (median) | weights file resident MiB after |")
    print("|---|---|---|---|")
    medians = {}
    for value, gen in gens.items():
        prefill = statistics.median(t[0] for t in times[value]) * 1e3
        decode = statistics.median(t[1] for t in times[value]) * 1e3
        medians[value] = (prefill, decode)
        mapping = np.frombuffer(gen._weights_file._map, dtype=np.uint8)
        print(f"| {value} | {prefill:.1f} | {decode:.2f} | {present_mib(mapping):.1f} |")
    print(f"\nreleasing / keeping: prefill {medians['1'][0] / medians['0'][0]:.3f}x the time, "
          f"decode {medians['1'][1] / medians['0'][1]:.3f}x")


if __name__ == "__main__":
    main()
