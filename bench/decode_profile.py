"""Where a decode step's time goes: the region's kernels by kind, the VM call around them, and Python.

    python3 bench/decode_profile.py                                   # SmolLM-135M folder, int4 and int8, 2 threads
    python3 bench/decode_profile.py --weights int4 --steps 48 --rounds 5
    python3 bench/decode_profile.py --random                          # SmolLM-135M's sizes, seeded random weights
    python3 bench/decode_profile.py --model /tmp/gen/qwen2_0_5b/hf --weights int8,int8_g32,gguf:/tmp/gen/qwen2_0_5b/model.q8_0.gguf

One generator per weights format (``bh.llm.from_hf`` of ``--model``, a transformers folder, read only; or a
random model of SmolLM-135M's config with ``--random``), a ``--prompt``-token prompt, then ``--rounds`` rounds,
each timing the same ``--steps`` decode tokens three ways, interleaved:

* ``generate``: ``(T(generate(prompt, steps + 1)) - T(generate(prompt, 1))) / steps``, the two calls back to
  back: what one token costs a user of ``Generator.generate`` (Python loop, sampling, VM call, region);
* ``vm``: the same decode steps as calls of the step function itself (``Generator._main``), every input made
  before the timer: the VM call per token (the VM's own work, host code between regions, the region call);
* ``region``: the region's own per-step profile (``set_profiling``) over those VM calls, reset after the
  prefill, summed by kind: the LM head's ``dense_wq`` apart from the decoder's, every other op by its name.

Fractions of the per-token time of ``generate`` (the median over the rounds of each): each kind of region
step; "VM call outside the region's steps" = vm - sum of steps (VM dispatch, argument binding, the region
call's own bookkeeping, any host op on llvm); "Python (loop, sampling, tensors)" = generate - vm.
The thread adaptation to contention is off by default (``--adapt``), so that every call runs the one plan
whose steps are profiled. ``--ab``: each format built twice, with session 13's region passes (the residual
adds summed by the ``dense_wq`` before them, the norms' gammas multiplied in their reduce, the MLP's gate
product in its up projection's ``dense_wq``) and without them
(:func:`before_session13`), timed in the same interleaved rounds. ``--env NAME=a,b`` (repeatable): each format once
per value of each such runtime variable (all combinations), the variable set while its generator is built and
warmed (plans are made, kernels chosen and weights prepared then), the others timed in the same interleaved
rounds: the A/B of a switch such as ``BYOC_HETERO_HUGE_PAGES=0,1``. ``--ab-loop``: each generator timed twice,
with its token loop and with session 13's (:func:`session13_tokens`: the step's four inputs converted from numpy
and its logits copied to numpy at every token). ``--ab-kv``: each generator timed with each of kv_attention's
decode forms (``BYOC_HETERO_KV_DECODE`` = ``rows``: heads round robin, ``grouped``: contiguous runs of heads,
``split``: each head's keys cut in one run per thread), the variable set around each timing (read at each
call). On a loaded machine only the fractions and the interleaved ratios mean anything, not the times: the
report says so, with ``lscpu``'s model and oneDNN's ISA. Results: bench/GENERATE.md.

    python3 bench/decode_profile.py --weights int4 --ab-loop --ab-kv --rounds 5 --steps 32   # session 14's A/Bs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_MODEL = "/tmp/s7gb/keep-full/smollm_135m/hf"
NEW_PASSES = ("fold_norm_weights", "fold_gate_products")
"""Session 13's region passes for int8 / int4 decoders (with ``dense_wq`` in ``fold_residual_adds``)."""
SMOLLM = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=True,
              head_dim=64)


def machine() -> str:
    """``lscpu``'s model name, oneDNN's ISA and the load average: the line every figure carries."""
    import byoc_hetero as bh

    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
    return (f"{model}; oneDNN {bh._C.onednn_version()} ISA {bh._C.isa()}; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def load_model(args):
    import torch
    import transformers

    if args.random:
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM)).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()


def build(model, fmt: str, max_length: int):
    """The generator of one ``--weights`` item: ``gguf:FILE`` -> ``bh.llm.from_gguf(FILE)`` (a GGUF file of the same
    weights, bench/gguf_write.py's), ``int8_g32`` -> ``from_hf(weights="int8", group_size=32)``, else ``from_hf``."""
    import byoc_hetero as bh

    if fmt.startswith("gguf:"):
        return bh.llm.from_gguf(fmt[5:], max_length=max_length)
    if fmt.endswith("_pc"):  # one scale per output channel, whatever the default
        return bh.llm.from_hf(model, max_length=max_length, weights=fmt[:-3], group_size=-1)
    weights, _, group = fmt.partition("_g")
    return bh.llm.from_hf(model, max_length=max_length, weights=weights, group_size=int(group) if group else None)


def step_kinds(region) -> dict[int, str]:
    """Node index -> the kind its steps are counted under: the op's name, ``dense_wq (LM head)`` for the
    weight-only dense whose output is the vocabulary wide (the widest dense_wq of the region)."""
    graph = json.loads(str(region["get_graph_json"]()))
    widths = {}
    for i, node in enumerate(graph["nodes"]):
        if node["op"] in ("dense_wq", "dense"):
            shape = graph["tensors"][node["output"]].get("shape", [])
            widths[i] = shape[-1] if shape and isinstance(shape[-1], int) else 0
    head = max(widths, key=widths.get) if widths else None
    return {i: node["op"] + (" (LM head)" if i == head else "") for i, node in enumerate(graph["nodes"])}


def region_seconds(regions, kinds: list[dict[int, str]]) -> tuple[dict[str, float], int]:
    """(seconds of the run steps called since the last reset, summed by kind (reorders and copies a step
    label names stay with their node's kind), how many step executions they were)."""
    out: dict[str, float] = {}
    calls = 0
    for region, kind_of in zip(regions, kinds):
        for step in json.loads(str(region["get_profile"]())):
            if step["phase"] != "run" or not step["calls"]:
                continue
            found = re.search(r" node (\d+) ", step["label"])
            kind = kind_of.get(int(found.group(1)), step["op"]) if found else step["op"]
            out[kind] = out.get(kind, 0.0) + step["seconds"]
            calls += step["calls"]
    return out, calls


class Profiler:
    """One generator's three timings (module doc), a round at a time, each inside ``context()`` (a variant of an
    A/B: a token loop, a variable)."""

    def __init__(self, gen, prompt: np.ndarray, steps: int, context=contextlib.nullcontext):
        import byoc_hetero as bh

        self.gen, self.prompt, self.steps, self.context = gen, prompt, steps, context
        self.regions = bh.codegen.region_modules(gen._executable)
        self.kinds = [step_kinds(r) for r in self.regions]
        for r in self.regions:
            r["set_profiling"](True)

    def generate_per_token(self) -> float:
        with self.context():
            start = time.perf_counter()
            self.gen.generate(self.prompt, 1)
            one = time.perf_counter() - start
            start = time.perf_counter()
            self.gen.generate(self.prompt, self.steps + 1)
            return (time.perf_counter() - start - one) / self.steps

    def vm_per_token(self) -> tuple[float, dict[str, float]]:
        """(wall seconds per decode call of the step function, region step seconds per call by kind);
        ``self.steps_per_token``: the region steps one decode call runs."""
        with self.context():
            return self._vm_per_token()

    def _vm_per_token(self) -> tuple[float, dict[str, float]]:
        import tvm

        gen, n = self.gen, self.prompt.shape[1]
        cache = gen.new_cache(1)
        one = np.ones(1, dtype="int64")
        logits = gen._call(self.prompt, np.zeros(1, dtype="int64"), np.array([n], dtype="int64"), cache)
        token = int(np.argmax(logits[0]))
        t = lambda a: tvm.runtime.tensor(np.asarray(a, dtype="int64"), tvm.cpu())  # noqa: E731
        lengths, last = t(one), t(np.zeros(1))
        for r in self.regions:
            r["reset_profile"]()
        total = 0.0
        for i in range(self.steps):
            args = (t([[token]]), t([n + i]), lengths, last)
            start = time.perf_counter()
            out = gen._main(*args, *cache)
            total += time.perf_counter() - start
            token = int(np.argmax(out.numpy()[0]))
        kinds, calls = region_seconds(self.regions, self.kinds)
        self.steps_per_token = calls / self.steps
        return total / self.steps, {k: v / self.steps for k, v in kinds.items()}


def session13_tokens(self, prompts, max_new_tokens, sampler, stop):
    """``Generator._tokens`` as session 13 left it (the A side of ``--ab-loop``): at every token, the step's four
    inputs made as TVM tensors from numpy arrays, the logits copied to a numpy array, ``np.isin`` over the stop
    ids."""
    import tvm

    def call(tokens, past, lengths):
        batch, rows = tokens.shape
        last = np.arange(batch, dtype="int64") * rows + np.maximum(lengths, 1) - 1
        t = lambda a: tvm.runtime.tensor(a, tvm.cpu())  # noqa: E731
        out = self._main(t(np.ascontiguousarray(tokens, dtype="int64")), t(past.astype("int64")),
                         t(lengths.astype("int64")), t(last), *cache)
        return out.numpy()

    if max_new_tokens == 0:
        return
    batch = len(prompts)
    lengths = np.array([p.size for p in prompts], dtype="int64")
    tokens = np.zeros((batch, int(lengths.max())), dtype="int64")
    for b, p in enumerate(prompts):
        tokens[b, :p.size] = p
    cache, rng = self.new_cache(batch), sampler.rng()
    past = np.zeros(batch, dtype="int64")
    done = np.zeros(batch, dtype=bool)
    for n in range(max_new_tokens):
        chosen = sampler.choose(call(tokens, past, lengths), rng)
        nxt = np.where(done, tokens[:, 0], chosen)
        done |= np.isin(nxt, sorted(stop))
        yield nxt
        if done.all() or n + 1 == max_new_tokens:
            return
        past = past + lengths
        lengths = np.where(done, 0, 1).astype("int64")
        tokens = nxt[:, None]


@contextlib.contextmanager
def session13_loop():
    """The A side of ``--ab-loop``: ``Generator._tokens`` replaced by :func:`session13_tokens`."""
    from byoc_hetero.llm.generator import Generator

    saved = Generator._tokens
    Generator._tokens = session13_tokens
    try:
        yield
    finally:
        Generator._tokens = saved


@contextlib.contextmanager
def kv_decode(mode: str):
    """``BYOC_HETERO_KV_DECODE`` = ``mode`` (kv_attention reads it at each call), restored after."""
    saved = os.environ.get("BYOC_HETERO_KV_DECODE")
    os.environ["BYOC_HETERO_KV_DECODE"] = mode
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("BYOC_HETERO_KV_DECODE")
        else:
            os.environ["BYOC_HETERO_KV_DECODE"] = saved


def variants(args) -> list[tuple[str, object]]:
    """(label suffix, context) of every timing variant the A/B flags ask, crossed: ``--ab-loop`` and ``--ab-kv``."""
    out = [("", contextlib.nullcontext)]
    if args.ab_loop:
        out = [(f"{label}, session 13 loop", lambda c=ctx: _both(c, session13_loop)) for label, ctx in out] + \
              [(f"{label}, session 14 loop", ctx) for label, ctx in out]
    if args.ab_kv:
        out = [(f"{label}, kv {mode}", lambda c=ctx, m=mode: _both(c, lambda: kv_decode(m)))
               for mode in ("rows", "grouped", "split") for label, ctx in out]
    return out


@contextlib.contextmanager
def _both(first, second):
    with first(), second():
        yield


def shares(gens: list[float], vms: list[float], kinds: list[dict[str, float]]) -> list[tuple[str, float, float]]:
    """(what, ms per token, share of generate's per-token time), medians over the rounds."""
    per_token, vm = float(np.median(gens)), float(np.median(vms))
    names = sorted({k for d in kinds for k in d}, key=lambda k: -np.median([d.get(k, 0.0) for d in kinds]))
    rows = [(k, float(np.median([d.get(k, 0.0) for d in kinds]))) for k in names]
    inside = float(np.median([sum(d.values()) for d in kinds]))
    rows += [("VM call outside the region's steps", vm - inside), ("Python (loop, sampling, tensors)", per_token - vm)]
    return [(what, sec * 1e3, sec / per_token) for what, sec in rows] + [("total (generate, per token)",
                                                                             per_token * 1e3, 1.0)]


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """The variables of ``env`` set inside, restored (or removed) after."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def before_session13():
    """The A side of ``--ab``: the decoder's residual adds after a ``dense_wq``, the norms' gammas before
    one and the MLP's gate products as region steps of their own, as before session 13
    (``fold_residual_adds`` without ``dense_wq``; :data:`NEW_PASSES` doing nothing)."""
    from byoc_hetero.backends.onednn.ops import layout
    from byoc_hetero.targets import get_target

    passes = get_target("onednn").lowering.passes
    sums, saved = dict(layout.SUMS_RESIDUAL), {name: passes[name] for name in NEW_PASSES}
    layout.SUMS_RESIDUAL.pop("dense_wq", None)
    passes.update({name: (lambda graph: None) for name in NEW_PASSES})
    try:
        yield
    finally:
        layout.SUMS_RESIDUAL.clear()
        layout.SUMS_RESIDUAL.update(sums)
        passes.update(saved)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a transformers ...ForCausalLM folder (read only)")
    ap.add_argument("--random", action="store_true", help="SmolLM-135M's config with seeded random weights")
    ap.add_argument("--weights", default="int4,int8",
                    help="comma-separated: bh.llm.from_hf weights formats (int8_g32: group_size 32, int8_pc: "
                         "per output channel), gguf:FILE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--adapt", default="off", help="thread adaptation mode: off (default) | auto | reduced")
    ap.add_argument("--ab", action="store_true",
                    help="each format twice: with session 13's folds (the default) and without (before_session13)")
    ap.add_argument("--env", action="append", default=[],
                    help="NAME=a,b: each format once per value of this runtime variable (repeatable)")
    ap.add_argument("--ab-loop", action="store_true",
                    help="each generator timed with its token loop and with session 13's (session13_tokens)")
    ap.add_argument("--ab-kv", action="store_true",
                    help="each generator timed with BYOC_HETERO_KV_DECODE=rows, =grouped and =split")
    args = ap.parse_args(argv)
    from weight_only import env_settings  # the same --env as bench/weight_only.py's (this script's folder)

    settings = env_settings(args.env)

    import byoc_hetero as bh

    bh._C.set_num_threads(args.threads)
    bh._C.set_thread_adaptation(args.adapt)
    model = load_model(args)
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(1, args.prompt)).astype("int64")
    print(f"# {machine()}; {args.threads} threads; adaptation {args.adapt}; prompt {args.prompt}, {args.steps} "
          f"decode steps, median of {args.rounds} interleaved rounds; "
          f"{'random weights' if args.random else args.model}")
    profilers = {}
    for fmt in args.weights.split(","):
        for before in ((True, False) if args.ab else (False,)):
            for env in settings:
                with environment(env):
                    with before_session13() if before else contextlib.nullcontext():
                        gen = build(model, fmt, args.prompt + args.steps + 2)
                    label = fmt + ("" if not args.ab else ", before session 13" if before else ", session 13")
                    label += " [" + " ".join(f"{k}={v}" for k, v in env.items()) + "]" if len(settings) > 1 else ""
                    for suffix, context in variants(args):
                        prof = profilers[label + suffix] = Profiler(gen, prompt, args.steps, context)
                        prof.generate_per_token()  # warm: plans made (kernels chosen), weights prepared
                        prof.vm_per_token()
    runs = {label: ([], [], []) for label in profilers}
    for _ in range(args.rounds):
        for label, prof in profilers.items():  # interleaved: every variant once a round
            gens, vms, kinds = runs[label]
            gens.append(prof.generate_per_token())
            vm, by_kind = prof.vm_per_token()
            vms.append(vm)
            kinds.append(by_kind)
    print(f"# adaptation {dict(bh._C.adaptation_stats())}")
    for label, (gens, vms, kinds) in runs.items():
        print(f"\n## {label}: {1 / np.median(gens):.1f} tok/s (generate, median), "
              f"{len(profilers[label].regions)} region(s), {profilers[label].steps_per_token:.0f} region steps a token\n")
        print("| share of a decode token | ms / token | share |")
        print("|---|---|---|")
        for what, ms, share in shares(gens, vms, kinds):
            print(f"| {what} | {ms:.3f} | {100 * share:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
