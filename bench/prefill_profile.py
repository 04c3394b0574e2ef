"""Where a generator's prefill goes: the region's per-step profile of ``bh.llm`` prefills, by op class, for
main's paths and this branch's side by side in one process.

    python bench/prefill_profile.py --hf /tmp/s7gb/keep-full/smollm_135m/hf --weights f32,int8 --prompts 128,1024
    python bench/prefill_profile.py --hf DIR --weights int8,int4 --before-kv auto --after-panels int

Variants: ``before``: kv_attention's form ``--before-kv`` (``BYOC_HETERO_KV_PREFILL``, read at each call; default
``rows``, the per-row form) and, for int8 / int4 weights, dense_wq's integer tile kernels at every row count
(``BYOC_HETERO_WQ_ACT=int8``, read when a plan is made: a generator of its own); ``after``: kv_attention as
``BYOC_HETERO_KV_PREFILL`` says (unset: ``auto``) and dense_wq's defaults with ``BYOC_HETERO_WQ_PANELS`` =
``--after-panels`` (default 0: none; ``1`` float panels, ``int`` the integer panel GEMM, from 16 rows). With
``--before-kv auto --after-panels int`` the variants differ in dense_wq's many-row form alone. ``--before-panels``
makes the before variant dense_wq's defaults too, with ``BYOC_HETERO_WQ_PANELS`` = that value: ``--before-kv auto
--before-panels int --after-panels int-fused`` differ in the integer panels' loop alone (the default against
session 15's opt-in one; the same results to the byte). Each variant's
variables are set before each of its prefills (a plan made again, e.g. for fewer threads, gets its own).
Per weight format and prompt length, each round runs one prefill (a fresh cache,
``Generator.step`` of the whole prompt) per variant, alternating, with the regions' profiling on. Prints per
variant the median wall time, the median time and share of each op class (denses split by their output width:
q/k/v, o or down, gate/up, LM head), and the regions' own time. Figures from a shared machine are loaded: read
the shares and the ratio of the variants measured side by side, not the times. Asserts nothing.
``--before-env`` / ``--after-env`` add variables of either variant (set after the ones above): a variable read
at each call (``BYOC_HETERO_KV_TILES``) compares the forms on the one f32 generator both variants share.
``--own-generators`` builds each variant's f32 generator under its own variables (one read when the step is
partitioned: ``BYOC_HETERO_COMBINE_BIASES``). ``--before-skip PASS,...`` builds the before variant without those region passes (``fold_gate_products``: the
GLU's product a binary step again), a generator of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
from collections import defaultdict

import numpy as np

FORMS = ("before", "after")
AFTER_KV = os.environ.get("BYOC_HETERO_KV_PREFILL", "auto")  # the after variant's kv_attention form
# each variant's environment (main() sets the before KV form and the after panel form from the options)
FORM_ENV = {"before": {"BYOC_HETERO_KV_PREFILL": "rows", "BYOC_HETERO_WQ_ACT": "int8", "BYOC_HETERO_WQ_PANELS": "0"},
            "after": {"BYOC_HETERO_KV_PREFILL": AFTER_KV, "BYOC_HETERO_WQ_ACT": "auto", "BYOC_HETERO_WQ_PANELS": "0"}}


def _dense_class(step: dict, spec) -> str:
    """The dense's role from its output width (the last dim of its dst / out layout), else its op and impl."""
    outs = re.findall(r"(?:dst|out)=\[([0-9,]+)\]", step.get("layouts") or "")
    width = int(outs[-1].split(",")[-1]) if outs else -1
    q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    names = {q + 2 * kv: "q/k/v", 2 * spec.intermediate: "gate/up", spec.vocab: "LM head", q: "q or o",
             kv: "k or v", spec.intermediate: "gate or up", spec.hidden: "o or down"}
    return f"{step['op']} {names.get(width, step['impl'])}"


def _classes(profile: list[dict], spec) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for step in profile:
        if step["phase"] != "run" or not step["calls"]:
            continue
        name = _dense_class(step, spec) if step["op"] in ("dense", "dense_wq") else step["op"]
        out[name] += step["seconds"]
    return out


def _prefill(gen, regions, tokens: np.ndarray, form: str) -> tuple[float, dict[str, float]]:
    os.environ.update(FORM_ENV[form])
    cache = gen.new_cache(1)
    for m in regions:
        m["reset_profile"]()
    t0 = time.perf_counter()
    gen.step(tokens, np.zeros(1, "int64"), np.array([tokens.shape[1]], "int64"), cache)
    wall = time.perf_counter() - t0
    classes: dict[str, float] = defaultdict(float)
    for m in regions:
        for k, v in _classes(json.loads(str(m["get_profile"]())), gen.spec).items():
            classes[k] += v
    return wall, classes


SKIPPED: dict[str, list[str]] = {form: [] for form in FORMS}
"""form -> the oneDNN region passes its generator is built without (``--before-skip``)."""
OWN_GENERATORS = [False]
"""``--own-generators``: each variant builds its own f32 generator under its variables (a variable read when
the step is partitioned, e.g. ``BYOC_HETERO_COMBINE_BIASES``)."""


def _built(bh, model, weights: str, max_length: int, skip: list[str]):
    """``bh.llm.from_hf`` with the region passes ``skip`` left out (their entries in the pass table replaced by a
    no-op while it builds)."""
    from byoc_hetero.targets import get_target

    passes = get_target("onednn").lowering.passes
    saved = {name: passes[name] for name in skip}
    try:
        for name in skip:
            passes[name] = lambda graph: None
        if weights == "int8_g32":  # as bench/decode_profile.py: int8 in blocks of 32 (llama.cpp's Q8_0 format)
            return bh.llm.from_hf(model, max_length=max_length, weights="int8", group_size=32)
        return bh.llm.from_hf(model, max_length=max_length, weights=weights)
    finally:
        passes.update(saved)


def _generators(bh, model, weights: str, max_length: int, prompts: list[int]) -> dict:
    """form -> (generator, its regions): one generator for f32 (unless a variant skips region passes); for int8 /
    int4 one per dense_wq path, each plan of a prompt length made (by a first prefill) under its form's variables
    (FORM_ENV)."""
    made = {}
    for form in FORMS:
        if weights == "f32" and made and not any(SKIPPED.values()) and not OWN_GENERATORS[0]:
            made[form] = made[FORMS[0]]
            continue
        os.environ.update(FORM_ENV[form])
        gen = _built(bh, model, weights, max_length, SKIPPED[form])
        regions = bh.codegen.region_modules(gen._executable)
        for m in regions:
            m["set_profiling"](True)
        for length in prompts:  # plans made and weights prepared outside the timed rounds
            _prefill(gen, regions, np.ones((1, length), "int64"), form)
        made[form] = (gen, regions)
    return made


def _pairs(text: str, option: str) -> dict[str, str]:
    """``NAME=VALUE,NAME=VALUE`` as a dict (empty text: none); a pair without ``=`` is an error naming ``option``."""
    out = {}
    for pair in filter(None, text.split(",")):
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise SystemExit(f"{option}: expected NAME=VALUE pairs separated by commas, got {pair!r}")
        out[name.strip()] = value.strip()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", required=True, help="a Hugging Face folder of a Llama-family decoder")
    ap.add_argument("--weights", default="f32")
    ap.add_argument("--prompts", default="128,1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before-kv", default="rows", help="kv_attention's form in the before variant")
    ap.add_argument("--after-panels", default="0",
                    help="BYOC_HETERO_WQ_PANELS in the after variant (0, 1, int, int-fused)")
    ap.add_argument("--before-panels", default=None,
                    help="BYOC_HETERO_WQ_PANELS in the before variant, with BYOC_HETERO_WQ_ACT=auto (default: the "
                         "integer tile kernels at every row count, BYOC_HETERO_WQ_ACT=int8)")
    for form in FORMS:
        ap.add_argument(f"--{form}-env", default="", metavar="NAME=VALUE,...",
                        help=f"more variables of the {form} variant (e.g. BYOC_HETERO_KV_TILES=wide), set last")
    ap.add_argument("--before-skip", default="", metavar="PASS,...",
                    help="oneDNN region passes the before variant is built without (e.g. fold_gate_products): "
                         "each variant then has its own generator")
    ap.add_argument("--own-generators", action="store_true",
                    help="each variant builds its own generator with its variables set (variables read when the "
                         "step is partitioned, e.g. --before-env BYOC_HETERO_COMBINE_BIASES=0 --after-env "
                         "BYOC_HETERO_COMBINE_BIASES=1)")
    args = ap.parse_args(argv)
    OWN_GENERATORS[0] = args.own_generators
    SKIPPED["before"] = [name for name in args.before_skip.split(",") if name]
    FORM_ENV["before"]["BYOC_HETERO_KV_PREFILL"] = args.before_kv
    if args.before_panels is not None:
        FORM_ENV["before"].update({"BYOC_HETERO_WQ_ACT": "auto", "BYOC_HETERO_WQ_PANELS": args.before_panels})
    FORM_ENV["after"]["BYOC_HETERO_WQ_PANELS"] = args.after_panels
    for form in FORMS:
        FORM_ENV[form].update(_pairs(getattr(args, f"{form}_env"), f"--{form}-env"))
    saved = {name: os.environ.get(name) for env in FORM_ENV.values() for name in env}
    import torch
    import transformers

    import byoc_hetero as bh

    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), "cpu ?")
    print(f"{cpu}, oneDNN ISA {bh._C.isa()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    model = transformers.AutoModelForCausalLM.from_pretrained(args.hf, torch_dtype=torch.float32).eval()
    prompts = [int(p) for p in args.prompts.split(",")]
    rng = np.random.default_rng(0)
    for weights in args.weights.split(","):
        made = _generators(bh, model, weights, max(prompts) + 1, prompts)
        for length in prompts:
            tokens = rng.integers(0, made[FORMS[0]][0].spec.vocab, (1, length)).astype("int64")
            walls: dict[str, list[float]] = {f: [] for f in FORMS}
            shares: dict[str, list[dict[str, float]]] = {f: [] for f in FORMS}
            for _ in range(args.rounds):
                for form in FORMS:
                    wall, classes = _prefill(*made[form], tokens, form)
                    walls[form].append(wall)
                    shares[form].append(classes)
            _report(weights, length, walls, shares)
        del made
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return 0


def _report(weights: str, length: int, walls: dict, shares: dict) -> None:
    print(f"\n{weights}, prompt {length}: median of {len(walls['before'])} interleaved prefills per variant")
    names = sorted({k for f in FORMS for c in shares[f] for k in c},
                   key=lambda k: -statistics.median(c.get(k, 0.0) for c in shares["before"]))
    print("| op class | " + " | ".join(f"{f} ms | {f} share" for f in FORMS) + " |")
    print("|---|" + "---|---|" * len(FORMS))
    for name in names:
        cells = []
        for f in FORMS:
            ms = statistics.median(c.get(name, 0.0) for c in shares[f]) * 1e3
            total = statistics.median(sum(c.values()) for c in shares[f]) * 1e3
            cells.append(f"{ms:.1f} | {100 * ms / total:.1f}%")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for f in FORMS:
        region = statistics.median(sum(c.values()) for c in shares[f]) * 1e3
        wall = statistics.median(walls[f]) * 1e3
        best = min(walls[f]) * 1e3
        print(f"- {f}: wall {wall:.1f} ms ({length / wall * 1e3:.0f} tok/s; best {best:.1f} ms, "
              f"{length / best * 1e3:.0f} tok/s), region steps {region:.1f} ms")


if __name__ == "__main__":
    raise SystemExit(main())
