"""Where the resident memory of ``bh.llm`` generation goes, stage by stage (issue 36's memory target).

    PYTHONPATH=. python bench/llm_memory.py --model smollm_135m --threads 2 [--contention] [--weights int8]
        [--save DIR] [--gguf FILE] [--hf FOLDER] [--phases]
    PYTHONPATH=. python bench/llm_memory.py --load DIR     # a fresh process loading a saved generator

One fresh process: imports, a seeded random transformers model of the named sizes (gen_engines.py),
``bh.llm.from_hf`` (``--weights``, f32 by default; max_length = prompt + new), the transformers model deleted, then a
generation (a prefill of ``--prompt`` tokens and ``--new`` decode steps); with ``--contention`` a second
one on the 1-thread contention plans (forced: what a busy machine makes). After each stage: VmRSS and
VmHWM (MiB; the peak within the stage: VmHWM is reset at each stage's start) and the resident size's
anonymous and file-backed shares (RssAnon; RssFile: pages of mapped files, such as a loaded generator's
weights.bin), and at the end the regions' prepared-weight bytes (get_runtime_info's
shared_bytes). ``--gguf FILE``: ``bh.llm.from_gguf(FILE)`` instead of the transformers model. ``--save DIR``:
then ``gen.save(DIR)`` and, in a fresh process, ``--load DIR``: ``bh.llm.load(DIR)`` and the same generation
(what a deployment does). Prints Markdown tables. Memory, not time: the figures hold on a loaded machine too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def status() -> tuple[int, int, int, int]:
    """(VmRSS, VmHWM, RssAnon, RssFile) in MiB."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                got[line.split(":")[0]] = int(line.split()[1]) // 1024
    return got["VmRSS"], got["VmHWM"], got["RssAnon"], got["RssFile"]


def mark(rows: list, name: str) -> None:
    """Append the row of the phase that just ended, then reset VmHWM to VmRSS (/proc/self/clear_refs 5),
    so that each row's peak is its own phase's."""
    rows.append((name, *status()))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def mappings(top: int) -> str:
    """The ``top`` largest resident shares of /proc/self/smaps, by what is mapped (a file's path, ``[heap]``,
    ``[anonymous]`` for the anonymous mappings together, and the 8 largest anonymous mappings on their own):
    where a stage's resident size lies."""
    by_name: dict[str, int] = {}
    anonymous: list[tuple[int, str]] = []
    name = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                name = head[5] if len(head) >= 6 else "[anonymous]"
                where = head[0]
            elif head and head[0] == "Rss:":
                kib = int(head[1])
                by_name[name] = by_name.get(name, 0) + kib
                if name == "[anonymous]":
                    anonymous.append((kib, where))
    rows = sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
    lines = ["| mapping | resident MiB |", "|---|---|"] + [f"| {n} | {k / 1024:.1f} |" for n, k in rows]
    lines += [f"| anonymous {where} | {k / 1024:.1f} |" for k, where in sorted(anonymous, reverse=True)[:8]]
    return "\n".join(lines)


MODEL_ROW = "+ the transformers model"


def ratios(rows: list, gen, f32_bytes: int | None) -> str:
    """Issue 36's ratios: the process over its first row (the imports), steady (the last row) and peak (the
    largest VmHWM after the first row), in (weights + KV cache): the weights are ``f32_bytes`` (a float32
    model's parameters) or else the generator's constants (its weights file: codes, scales and what stays
    float); the cache is one sequence of max_length positions."""
    spec = gen.spec
    cache = 2 * spec.layers * spec.kv_heads * gen.max_length * spec.head_dim * 4
    file = gen._weights_file
    held = os.path.getsize(file.path) if file is not None and os.path.exists(file.path) else None
    if held is None and file is not None and file._map is not None:
        held = len(file._map)
    weights = f32_bytes if f32_bytes is not None else held or 0
    base = rows[0][1]
    steady, peak = rows[-1][1] - base, max(r[2] for r in rows[1:]) - base
    ours = max(r[2] for r in rows[1:] if r[0] != MODEL_ROW) - base  # the model's making: the caller's (torch's init)
    d = (weights + cache) / 2**20
    return (f"over the first row ({base} MiB): steady {steady} MiB = {steady / d:.3f}x; peak {peak} MiB = "
            f"{peak / d:.3f}x, from `from_hf` on {ours} MiB = {ours / d:.3f}x (weights {weights / 2**20:.0f} MiB"
            f"{' f32' if f32_bytes is not None else ' held by the generator'} + cache {cache / 2**20:.1f} MiB)")


def table(rows: list) -> str:
    lines = ["| stage | VmRSS MiB | VmHWM MiB | anonymous MiB | file-backed MiB |", "|---|---|---|---|---|"]
    return "\n".join(lines + [f"| {name} | {rss} | {hwm} | {anon} | {file} |" for name, rss, hwm, anon, file in rows])


class Phases:
    """``--phases``: VmRSS after, and the peak within (VmHWM, reset at each call's start; a call inside
    another is a phase of its own and its peak counts in the outer one's), each call of the build's steps
    (``PHASES``), in order: where the peak of ``from_hf`` / ``from_gguf`` comes from (tracemalloc does
    not see TVM's, oneDNN's or numpy's C buffers)."""

    def __init__(self):
        self.rows: list = []
        self._stack: list = []  # the running peak of each open call

    def _hwm(self) -> int:
        return status()[1]

    def _reset(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def wrap(self, owner, attr: str, name) -> None:
        """Replace ``owner.attr`` by a function recording each of its calls as a row ``name`` (a string, or
        a function of the call's arguments returning one)."""
        inner = getattr(owner, attr)

        def recorded(*args, **kwargs):
            label = name(*args, **kwargs) if callable(name) else name
            if self._stack:
                self._stack[-1] = max(self._stack[-1], self._hwm())
            self._reset()
            self._stack.append(0)
            before = status()[0]
            try:
                return inner(*args, **kwargs)
            finally:
                peak = max(self._stack.pop(), self._hwm())
                self.rows.append((label, before, status()[0], peak))
                if self._stack:
                    self._stack[-1] = max(self._stack[-1], peak)
                self._reset()

        setattr(owner, attr, recorded)

    def install(self) -> None:
        """Wrap the build's steps (module attributes, looked up when called)."""
        import importlib

        import tvm.relax

        import byoc_hetero.llm as llm
        from byoc_hetero.llm import generator

        from byoc_hetero.passes import Pass

        stages = importlib.import_module("byoc_hetero.stages")  # the package's attribute is the function
        self.wrap(Pass, "run", lambda p, *_args, **_kwargs: f"pass {p.name}")  # each pass of the lists

        for owner, attr in ((llm, "decoder_weights"), (llm, "_quantized"),
                            (stages, "shared_params"), (stages, "bind_params"), (stages, "run_passes"),
                            (generator, "external_constants"), (tvm.relax, "build"),
                            (generator, "spill_weights"), (generator, "give_constants"),
                            (generator, "return_freed_heap")):
            if hasattr(owner, attr):  # an older tree may lack one (spill_weights: session 14)
                self.wrap(owner, attr, f"{owner.__name__.split('.')[-1]}.{attr}")
        inner_stages = stages.stages

        def wrapped_stages(*args, **kwargs):
            out = []
            for i, stage in enumerate(inner_stages(*args, **kwargs)):
                holder = type("Stage", (), {"call": staticmethod(stage)})
                self.wrap(holder, "call", f"stage {i} ({stage.info.name})")
                out.append(holder.call)
            return out

        stages.stages = wrapped_stages

    def table(self) -> str:
        lines = ["| call (in order of return) | VmRSS before MiB | VmRSS after MiB | peak within MiB |",
                 "|---|---|---|---|"]
        return "\n".join(lines + [f"| {n} | {b} | {a} | {p} |" for n, b, a, p in self.rows])


def prepared_mib(gen) -> float:
    """The regions' prepared-weight MiB, for a built (Executable) or a loaded (runtime Module) generator."""
    from byoc_hetero._relax import imported_modules

    root = gen._executable.jit() if hasattr(gen._executable, "jit") else gen._executable
    mods = [m for m in imported_modules(root) if str(m.kind) == "byoc_hetero"]
    return sum(json.loads(m["get_runtime_info"]())["shared_bytes"] for m in mods) / 2**20


def load_main(folder: str, threads: int, prompt: int, new: int) -> None:
    """The fresh process of ``--load``: imports, ``bh.llm.load``, one generation."""
    import numpy as np

    import byoc_hetero as bh
    from byoc_hetero import _C
    from gen_engines import prompt_ids

    _C.set_num_threads(threads)
    rows: list = []
    mark(rows, "imports (TVM, oneDNN; no torch)")
    gen = bh.llm.load(folder)
    mark(rows, "`bh.llm.load` done")
    ids = np.asarray(prompt_ids(gen.spec.vocab, prompt))[None]
    gen.generate(ids, new)
    mark(rows, f"generate ({prompt} + {new}, {threads} threads)")
    print(f"loaded {folder}: prepared weights {prepared_mib(gen):.0f} MiB\n")
    print(table(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm_135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--contention", action="store_true", help="then generate on the 1-thread contention plans")
    ap.add_argument("--weights", default="f32", help="from_hf's weights: f32 (default), int8, int4")
    ap.add_argument("--gguf", help="build with bh.llm.from_gguf(FILE) instead of a transformers model")
    ap.add_argument("--hf", help="a Hugging Face folder (float32) instead of --model's seeded random model")
    ap.add_argument("--save", help="then save the generator to DIR and load it in a fresh process")
    ap.add_argument("--load", help="only load the generator saved in DIR and generate (a fresh process)")
    ap.add_argument("--phases", action="store_true", help="then a table of the build's steps (class Phases)")
    ap.add_argument("--smaps", type=int, default=0, help="then the N largest resident mappings (/proc/self/smaps)")
    ap.add_argument("--torch-first", action="store_true",
                    help="make, run and drop a 2-layer model of the family before the first row: torch's first-use "
                         "runtime (about 137 MiB, whatever the model) then counts in the imports, not the generator")
    ap.add_argument("--model-imports", action="store_true",
                    help="import the model family's transformers modules before the first row (no model made, no "
                         "torch op run): what any process holding such a model has imported (129 of torch's "
                         "'first use' 137 MiB, session 16), so that the ratios count what the model and the "
                         "generator add")
    ap.add_argument("--trim", action="store_true",
                    help="a row after the model's deletion: the heap's free pages handed back (malloc_trim)")
    args = ap.parse_args()
    if args.load:
        os.environ.setdefault("BYOC_HETERO_ADAPT_THREADS", "off")
        load_main(args.load, args.threads, args.prompt, args.new)
        return
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
    phases = Phases() if args.phases else None
    if phases:
        phases.install()
    if args.torch_first:
        small = transformers.AutoModelForCausalLM.from_config(model_config(args.model, small=True)).eval()
        with torch.no_grad():
            small(torch.zeros((1, 8), dtype=torch.long))
        del small
        gc.collect()
    if args.model_imports and not args.gguf:
        import importlib

        config = model_config(args.model, small=True) if not args.hf else transformers.AutoConfig.from_pretrained(args.hf)
        importlib.import_module(transformers.AutoModelForCausalLM._model_mapping[type(config)].__module__)
    mark(rows, "imports (torch, transformers, TVM, oneDNN)" + (" + torch's first use" if args.torch_first else "") +
         (" + the family's modeling modules" if args.model_imports and not args.gguf else ""))
    if args.gguf:
        gen = bh.llm.from_gguf(args.gguf, max_length=args.prompt + args.new)
        weights, vocab = os.path.getsize(args.gguf), gen.spec.vocab
        mark(rows, f"`from_gguf` done ({gen.weights})")
        what = f"{args.gguf}: {weights / 2**20:.0f} MiB file"
    else:
        if args.hf:
            model = transformers.AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32).eval()
            args.model = args.hf
        else:
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(model_config(args.model, small=False)).eval()
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        mark(rows, MODEL_ROW)
        gen = bh.llm.from_hf(model, max_length=args.prompt + args.new, weights=args.weights)
        mark(rows, f"`from_hf` done ({args.weights})")
        vocab = model.config.vocab_size
        del model
        gc.collect()
        mark(rows, "transformers model deleted")
        if args.trim:
            bh.llm.return_freed_heap()
            mark(rows, "the heap trimmed (bh.llm.return_freed_heap)")
        what = f"{args.model}: {weights / 2**20:.0f} MiB of f32 weights"
    ids = np.asarray(prompt_ids(vocab, args.prompt))[None]
    gen.generate(ids, args.new)
    mark(rows, f"generate ({args.prompt} + {args.new}, {args.threads} threads)")
    if args.contention:
        _C.set_thread_adaptation("reduced")
        gen.generate(ids, args.new)
        mark(rows, "again on the 1-thread contention plans")
    if args.save:
        gen.save(args.save)
        mark(rows, f"`gen.save` ({sum(f.stat().st_size for f in Path(args.save).iterdir()) / 2**20:.0f} MiB)")
    info = [json.loads(m["get_runtime_info"]()) for m in region_modules(gen._executable)]
    print(f"{what}; prepared weights {prepared_mib(gen):.0f} MiB; contention plans "
          f"{[i['contention_plans'] for i in info]}; oneDNN {_C.onednn_version()} ISA {_C.isa()}\n")
    print(table(rows))
    print("\n" + ratios(rows, gen, weights if args.weights == "f32" and not args.gguf else None))
    if phases:
        print("\nThe build's steps (--phases):\n")
        print(phases.table())
    if args.smaps:
        print(f"\nThe largest resident mappings at the end (--smaps {args.smaps}):\n")
        print(mappings(args.smaps))
    if args.save:
        print()
        sys.stdout.flush()
        subprocess.run([sys.executable, __file__, "--load", args.save, "--threads", str(args.threads),
                        "--prompt", str(args.prompt), "--new", str(args.new)], check=True)


if __name__ == "__main__":
    main()
