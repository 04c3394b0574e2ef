"""Where weights="int8"'s logits error comes from: the weights' codes or the activations' (issue 37).

An independent simulation in torch of what our int8 path computes, on a transformers model (the
benchmark folders of bench/generate.py, /tmp/gen/<model>/hf): each dense's weight (every nn.Linear, and the
tied embedding table with the LM head) replaced by its dequantized codes under one scale rule, and, with
``int8`` activations, each nn.Linear's input rounded as dense_wq's int8-activation kernels round it (per
block of 32 along K: scale max |x| / 127, codes round-half-even; llama.cpp's Q8_0 activations too). Logits
of all prompt positions against the float model's:

* ``last``: bench/generate.py's error column, max |l - l_ref| / max |l_ref| at the prompt's last position;
* ``mean``: the same per position, averaged over the prompt's positions (steadier);
* ``rms``: sqrt(mean (l - l_ref)^2 / mean l_ref^2) over every position and logit.

Scale rules (``--rules``): ``pc`` one scale per output channel, max |w| / 127 (``from_hf(weights="int8",
group_size=-1)``);
``pc-mse`` per channel, the clipping ratio (of 7 from 0.85 to 1) of least squared error per channel; ``pc-asym``
per channel with a zero point, uint8 codes over [min(w, 0), max(w, 0)]; ``g32`` / ``g64`` / ``g128`` a float16
scale per block of that many k, each code the nearest on it (``group_size=32, rounding="nearest"``: Q8_0's
scales); ``g32-gguf`` llama.cpp's rounding (``rounding="gguf"``: the codes from the float32 scale, Q8_0's
codes bit for bit); ``sub8`` / ``sub4`` a float32 scale per channel
times an 8- / 4-bit factor per block of 32 (rounded up, so no code clips): the form a two-level kernel would read,
1 / 0.5 byte per 32 weights; ``f32`` the float weights (with ``int8`` activations: the activations' part alone).
``--scopes``: ``all`` every dense and the table, ``layers`` the decoder's denses only, ``head`` the LM head /
table only. ``--engine``: our engine itself beside the simulation, ``bh.llm.from_hf(weights="int8")`` for the
rules it builds (``pc``: per channel, ``gN``: ``group_size=N``, ``-gguf``: ``rounding="gguf"``) with ``BYOC_HETERO_WQ_ACT`` = ``f32`` / ``int8``
(``acts``), its prompt's last logits through ``gen.step`` (``last`` only). Asserts nothing; prints one JSON line
per cell and a markdown table.

    PYTHONPATH=. python3 bench/int8_error.py --hf /tmp/gen/qwen2_0_5b/hf --rules f32,pc,g32 --acts f32,int8 --engine
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _blocks(w: np.ndarray, g: int) -> np.ndarray:
    return w.reshape(w.shape[0], w.shape[1] // g, g)


def _nonzero(s: np.ndarray) -> np.ndarray:
    return np.where(s > 0, s, 1.0)


def q_channel(w: np.ndarray, ratio: float = 1.0) -> np.ndarray:
    s = _nonzero(np.abs(w).max(1, keepdims=True)) * ratio / 127
    return np.clip(np.rint(w / s), -127, 127) * s


def q_channel_mse(w: np.ndarray, ratios=np.linspace(0.85, 1.0, 7)) -> np.ndarray:
    best, out = None, None
    for r in ratios:
        d = q_channel(w, r)
        e = ((d - w) ** 2).sum(1, keepdims=True)
        if best is None:
            best, out = e, d
        else:
            better = e < best
            best, out = np.where(better, e, best), np.where(better, d, out)
    return out


def q_channel_asym(w: np.ndarray) -> np.ndarray:
    lo, hi = np.minimum(w.min(1, keepdims=True), 0), np.maximum(w.max(1, keepdims=True), 0)
    s = _nonzero(hi - lo) / 255
    z = np.clip(np.rint(-lo / s), 0, 255)
    return (np.clip(np.rint(w / s) + z, 0, 255) - z) * s


def q_group(w: np.ndarray, g: int) -> np.ndarray:
    b = _blocks(w, g)
    s = _nonzero(np.abs(b).max(2, keepdims=True) / 127).astype(np.float16).astype(w.dtype)
    return (np.clip(np.rint(b / s), -127, 127) * s).reshape(w.shape)


def q_group_gguf(w: np.ndarray, g: int) -> np.ndarray:
    """llama.cpp's Q8_0 rule at blocks of ``g``: in float32, d = max |w| / 127, codes roundf(w * (1 / d)) (ties away
    from zero); d then stored as float16 (an underflowing d reads 0)."""
    b = _blocks(w.astype(np.float32), g)
    d = np.abs(b).max(2, keepdims=True) / np.float32(127)
    x = b * (np.float32(1) / np.where(d > 0, d, np.float32(1)))
    q = np.sign(x) * np.floor(np.abs(x).astype(np.float64) + 0.5)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(w.shape)


def q_sub(w: np.ndarray, levels: int, g: int = 32) -> np.ndarray:
    d = _nonzero(np.abs(w).max(1, keepdims=True)).astype(np.float32).astype(w.dtype)[:, :, None] / 127
    b = _blocks(w, g)
    ideal = np.abs(b).max(2, keepdims=True) / 127
    factor = np.clip(np.ceil(ideal / d * levels), 1, levels)
    s = d * factor / levels
    return (np.clip(np.rint(b / s), -127, 127) * s).reshape(w.shape)


RULES = {
    "f32": lambda w: w, "pc": q_channel, "pc-mse": q_channel_mse, "pc-asym": q_channel_asym,
    "g32": lambda w: q_group(w, 32), "g64": lambda w: q_group(w, 64), "g128": lambda w: q_group(w, 128),
    "g32-gguf": lambda w: q_group_gguf(w, 32),
    "sub8": lambda w: q_sub(w, 255), "sub4": lambda w: q_sub(w, 15),
}


def quantized(w: np.ndarray, rule, chunk: int = 8192) -> np.ndarray:
    """``rule`` on ``w`` [N, K] a chunk of rows at a time, in float64 (the table's 136M weights too)."""
    return np.concatenate([rule(w[i:i + chunk].astype(np.float64)) for i in range(0, w.shape[0], chunk)])


def metrics(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    per = np.abs(got - ref).max(1) / np.abs(ref).max(1)
    return {"last": float(per[-1]), "mean": float(per.mean()),
            "rms": float(np.sqrt(((got - ref) ** 2).mean() / (ref ** 2).mean()))}


def engine_rows(model, ids, ref: np.ndarray, rules: list[str], acts: list[str]) -> list[dict]:
    """``last`` of our generator for each rule it builds (pc, gN) and activation form (module docstring)."""
    import gc
    import os

    import byoc_hetero as bh

    rows, before = [], os.environ.get("BYOC_HETERO_WQ_ACT")
    for rule in [r for r in rules if r == "pc" or r[1:].removesuffix("-gguf") in ("32", "64", "128")]:
        for act in acts:
            os.environ["BYOC_HETERO_WQ_ACT"] = act  # read when the kernels are built
            t = time.time()
            gen = bh.llm.from_hf(model, max_length=ids.shape[1] + 1, weights="int8", rounding="gguf"
                                 if rule.endswith("-gguf") else "nearest",
                                 group_size=-1 if rule == "pc" else int(rule[1:].removesuffix("-gguf")))
            n = ids.shape[1]
            out = np.asarray(gen.step(ids.numpy(), np.zeros(1, np.int64), np.array([n], np.int64), gen.new_cache(1)))
            last = float(np.abs(out[0] - ref[-1]).max() / np.abs(ref[-1]).max())
            rows.append({"rule": rule, "scope": "engine", "acts": act, "last": last, "mean": float("nan"),
                         "rms": float("nan"), "s": round(time.time() - t, 1)})
            print(json.dumps(rows[-1]), flush=True)
            del gen
            gc.collect()
    if before is None:
        os.environ.pop("BYOC_HETERO_WQ_ACT")
    else:
        os.environ["BYOC_HETERO_WQ_ACT"] = before
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf", required=True, help="a transformers ...ForCausalLM folder")
    ap.add_argument("--rules", default="f32,pc,g32", help=", ".join(RULES))
    ap.add_argument("--scopes", default="all", help="all, layers, head")
    ap.add_argument("--acts", default="f32,int8", help="f32, int8")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", action="store_true", help="our engine's last-position error beside (pc, gN)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from gen_engines import prompt_ids

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
    ids = torch.from_numpy(prompt_ids(model.config.vocab_size, args.prompt)[None])
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 2}
    int8_acts = [False]

    def round_input(module, inputs):  # dense_wq's activations: blocks of 32 along K, max |x| / 127
        if not int8_acts[0]:
            return None
        x = inputs[0]
        b = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
        amax = b.abs().amax(-1, keepdim=True)
        inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
        return (torch.round(b * inv) * (amax / 127)).reshape(x.shape),

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_pre_hook(round_input)

    def logits() -> np.ndarray:
        with torch.no_grad():
            return model(ids).logits[0].double().numpy()

    ref = logits()
    rows = engine_rows(model, ids, ref, args.rules.split(","), args.acts.split(",")) if args.engine else []
    scopes = {"all": lambda n: True, "head": lambda n: "embed" in n or "lm_head" in n,
              "layers": lambda n: "embed" not in n and "lm_head" not in n}
    for rule in args.rules.split(","):
        for scope in args.scopes.split(","):
            t = time.time()
            for n, p in model.named_parameters():
                if n in weights:
                    w = weights[n].numpy()
                    p.data.copy_(torch.from_numpy(quantized(w, RULES[rule]) if scopes[scope](n) else w).float())
            for act in args.acts.split(","):
                int8_acts[0] = act == "int8"
                row = {"rule": rule, "scope": scope, "acts": act, **metrics(logits(), ref)}
                row["s"] = round(time.time() - t, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| rule | scope | activations | last | mean | rms |\n|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[m]:.2e}" if r[m] == r[m] else "—" for m in ("last", "mean", "rms")]
        print(f"| {r['rule']} | {r['scope']} | {r['acts']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
