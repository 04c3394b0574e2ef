"""Generation benchmark: greedy decoding of three decoder sizes, ours (``bh.llm``) against llama.cpp, ONNX Runtime
GenAI, OpenVINO GenAI and transformers' own ``generate``, side by side on the same random weights.

    python bench/generate.py --keep /tmp/gen --markdown bench/GENERATE.md               # everything (hours)
    python bench/generate.py --small --keep /tmp/gen-small --rounds 1                   # smoke run (minutes)
    python bench/generate.py --models smollm_135m --engines hf,llama_cpp --formats llama_cpp=f32,q8_0
    python bench/generate.py --keep /tmp/gen --prepare-only --genai-python /tmp/venv/bin/python \
        --optimum-cli /tmp/ovx/bin/optimum-cli                                        # every file, no timing

``--genai-python PATH`` (or ``$GENAI_PYTHON``): the interpreter of the ONNX Runtime GenAI and OpenVINO GenAI
workers (files and measurements), an environment with those packages on top of ours (``--system-site-packages``);
the rest runs by this one. ``--optimum-cli PATH`` (or ``$OPTIMUM_CLI``): optimum-intel's exporter, which may pin
other transformers than ours, in an environment of its own. Exports run offline (``HF_HUB_OFFLINE``): they read
the local folder. ``--prepare-only`` writes every file into ``--keep`` and measures nothing, so that a quiet run
only times.

Models (``gen_engines.model_config``): a Llama decoder with SmolLM-135M's sizes, a Qwen2 decoder with
Qwen2.5-0.5B's and a Llama decoder with Llama-3.2-1B's (its llama3 RoPE scaling included), tied embeddings,
seeded random weights (nothing is downloaded); ``--small``: the same families at 2 layers of width 64. Each is
saved once as a Hugging Face folder under ``--keep DIR``, and every engine's files are written from that folder
(GGUF by ``bench/gguf_write.py``, ONNX by ONNX Runtime GenAI's model builder, OpenVINO IR by optimum-intel), so
all engines run the same weights.

Engines and formats (``--engines``, ``--formats ENGINE=F,F``): ``ours`` f32 (``bh.llm.from_hf``; skipped with
the reason where ``byoc_hetero.llm`` is missing), ``ours_gguf`` q8_0 / q4_0 (also f32 / f16: ``bh.llm.from_gguf``
on the same GGUF files as llama.cpp), ``hf`` f32 (transformers ``generate``), ``llama_cpp`` f32 /
f16 / q8_0 / q4_0 (``llama-cpp-python``), ``ort_genai`` fp32 / int4, ``openvino_genai`` fp32 / int8 / int4.
Each engine gets the same random prompt ids (batch 1) and decodes greedily, the end-of-sequence token ignored.

Each (model, engine, format, thread count) runs in its own process with ``OMP_NUM_THREADS`` &c. set, in
``--rounds`` interleaved rounds (every cell once per round, fresh processes, the order rotated by one cell each
round, ``--pause`` seconds of rest and a wait for idle CPUs before each; a cell's figures are the best of its
rounds). A process loads the engine, warms it up, then measures:

* time to first token for prompts of 128 and 1024 (``--prompts``; the best of ``--reps``); prefill tokens/s =
  prompt length / that time;
* 128 new tokens (``--new``) after the 128 prompt; decode tokens/s = (new - 1) / (T(new) - T(1)), each
  repetition timing ``generate(prompt, 1)`` and ``generate(prompt, new)`` back to back (their difference is
  that repetition's decode time: a slow moment hits one pair, not a TTFT measured apart and subtracted from
  another run, which once read 312 tok/s, 150% of the bound), the median of the ``--reps`` pairs;
  the table gives the best and the median of the rounds, and flags (and does not count as its best) a round
  above twice the measured bandwidth bound: a timing glitch. Rounds between the bound and twice it are kept:
  numpy's read is a lower estimate of what the memory delivers (session 10, quiet: llama.cpp f32 decoded a
  0.5B model at 8.0 tok/s against a "bound" of 7.1 from a 14.1 GB/s numpy read, and our GEMV steps streamed
  ~20 GB/s), so "% of bound" above 100% means the bound was low, not the timing;
* its peak resident size (``VmHWM``: loading, conversion of weights and the measurement included; read before
  the logits' check);
* the last position's logits after the 128 prompt where the engine exposes them (OpenVINO GenAI's pipeline does
  not: its exported IR compiled by OpenVINO itself gives them): error = max |l - l_ref| / max |l_ref| against
  transformers' f32 logits; the 128 new tokens against transformers' f32 tokens.

Beside them: the machine's memory bandwidth (numpy: each thread reads / copies its share of a 512 MiB buffer,
best of 5) at each thread count, and the decode bound it implies: tokens/s <= read bandwidth / bytes read per
token, with bytes = the weights read per token (every matrix and the LM head, at the format's nominal width)
+ the f32 KV cache at the mean context. ``lscpu``'s model name and oneDNN's ISA head every report;
``--markdown FILE`` appends it. Not part of the tests: it asserts nothing, it reports.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gen_engines import (ENGINES, GENAI_ENGINES, LABELS, MODELS, Unavailable, width,  # noqa: E402
                         load_engine, prompt_ids, save_model)
import run  # noqa: E402
from run import package_versions, wait_quiet  # noqa: E402

VERSIONED = ("byoc-hetero", "apache-tvm", "torch", "transformers", "llama_cpp_python", "gguf", "onnxruntime-genai",
             "openvino-genai", "optimum-intel", "numpy")
#: the versions reported for the GenAI engines' interpreter and optimum-cli's environment where they are others
GENAI_VERSIONED = ("onnxruntime-genai", "onnxruntime", "openvino-genai", "openvino")
EXPORT_VERSIONED = ("optimum-intel", "optimum", "nncf", "openvino", "transformers", "torch")


def machine() -> str:
    """``lscpu``'s model name, oneDNN's ISA (byoc-hetero's runtime), the CPU count and the load average."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "cpu ?")
    try:
        import byoc_hetero as bh

        isa = f"oneDNN {bh._C.onednn_version()} ISA {bh._C.isa()}"
    except Exception as err:  # noqa: BLE001 - reported, not fatal
        isa = f"oneDNN ISA unknown ({type(err).__name__}: {err})"
    return f"{cpu}, {isa}, {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f}"


# ------------------------------------------------------------------------------------------------
# Workers (each in its own process)


def peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _best_time(fn, reps: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def decode_times(eng, base: np.ndarray, new: int, reps: int) -> tuple[list[float], list[int]]:
    """Each repetition's decode time, T(generate new) - T(generate 1), the two timed back to back; the tokens."""
    times, toks = [], []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        eng.generate(base, 1)
        t1 = time.perf_counter()
        toks = eng.generate(base, new)
        times.append((time.perf_counter() - t1) - (t1 - t0))
    return times, [int(t) for t in toks]


def round_decode_tps(r: dict, new: int, first_prompt: int) -> float:
    """One round's decode tokens/s: the median of its repetitions (older records: total - TTFT)."""
    if "decode_s" in r:
        per = float(np.median(r["decode_s"])) / max(1, new - 1)
    else:
        per = (r["decode_total_s"] - r["ttft_s"][str(first_prompt)]) / max(1, new - 1)
    return 1.0 / per if per > 0 else float("inf")


def measure_worker(spec: dict) -> dict:
    """Load one engine in one format and measure it (the figures of the module docstring)."""
    prompts, new, reps = spec["prompts"], spec["new"], spec["reps"]
    ids = prompt_ids(spec["vocab_size"], max(prompts))
    base = ids[:prompts[0]]
    t0 = time.perf_counter()
    try:
        eng = load_engine(spec["engine"], spec["hf"], spec["files"], spec["format"], spec["threads"],
                          max(prompts) + new)
    except Unavailable as err:
        return {"skipped": str(err)}
    res = {"load_s": time.perf_counter() - t0}
    eng.generate(base, 2)  # warm-up: first-call allocations, plans
    res["ttft_s"] = {str(p): _best_time(lambda p=p: eng.generate(ids[:p], 1), reps)[0] for p in prompts}
    res["decode_s"], res["tokens"] = decode_times(eng, base, new, reps)
    res["peak_rss_mib"] = peak_rss_mib()  # before the logits' check (OpenVINO's compiles a second model)
    logits = eng.logits(base)
    if logits is not None:
        path = os.path.join(spec["out"], f"logits_{spec['engine']}_{spec['format']}_{spec['threads']}.npy")
        np.save(path, np.asarray(logits, dtype=np.float32))
        res["logits"] = path
    return res


def bandwidth_worker(threads: int, mib: int = 512, reps: int = 5) -> dict:
    """Read and copy bandwidth (GB/s) of ``threads`` threads, each on its share of a ``mib`` MiB buffer
    (numpy releases the GIL in ``dot`` and ``copyto``; BLAS itself single-threaded by the caller's env)."""
    n = mib * 2**20 // 4
    src, dst = np.ones(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
    parts = np.array_split(np.arange(n), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def run(job) -> float:
        workers = [threading.Thread(target=job, args=b) for b in bounds]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - t0

    def read(a, b):
        np.dot(src[a:b], src[a:b])

    def copy(a, b):
        np.copyto(dst[a:b], src[a:b])

    run(copy)
    read_s = min(run(read) for _ in range(reps))
    copy_s = min(run(copy) for _ in range(reps))
    return {"read_gbs": src.nbytes / read_s / 1e9, "copy_gbs": 2 * src.nbytes / copy_s / 1e9}


def _spawn(argv: list[str], threads: int, timeout: float, python: str | None = None) -> dict:
    """This script's ``argv`` in a process of ``python`` (default: this one) with the thread variables set
    (``run._spawn``)."""
    return run._spawn(argv, threads, timeout=timeout, script=os.path.abspath(__file__), python=python)


def versions_line(genai_python: str | None, optimum_cli: str | None) -> str:
    """The report's versions: this interpreter's; the GenAI engines' interpreter's and optimum-cli's
    environment's where they are others (its ``python`` beside the ``optimum-cli`` script)."""
    line = f"Versions: {package_versions(VERSIONED)}"
    others = [("ONNX Runtime GenAI / OpenVINO GenAI run by", genai_python, GENAI_VERSIONED),
              ("OpenVINO IR exported by", optimum_cli and os.path.join(os.path.dirname(optimum_cli), "python"),
               EXPORT_VERSIONED)]
    for what, python, names in others:
        if python:
            got = _spawn(["--versions", ",".join(names)], 1, 120, python)
            line += f"; {what} {python}: {got.get('versions') or got.get('error')}"
    return line


# ------------------------------------------------------------------------------------------------
# Reference and figures


def reference_worker(spec: dict) -> dict:
    """transformers' f32 tokens (``new`` after the first prompt) and last logits: what every engine is checked
    against."""
    from gen_engines import HF

    hf = HF(spec["hf"], "f32", spec["threads"], max(spec["prompts"]) + spec["new"])
    base = prompt_ids(spec["vocab_size"], spec["prompts"][0])
    path = os.path.join(spec["out"], "logits_reference.npy")
    logits = hf.logits(base)
    np.save(path, logits)
    top2 = np.sort(logits)[-2:]
    return {"tokens": hf.generate(base, spec["new"]), "logits": path, "top2_gap": float(top2[1] - top2[0])}


def files_worker(spec: dict) -> dict:
    """Write the files of one engine and format from the Hugging Face folder (once; kept in ``--keep``)."""
    make = ENGINES[spec["engine"]][3]
    if make is None:
        return {"files": spec["hf"]}
    try:
        return {"files": make(spec["hf"], spec["files"], spec["format"])}
    except Unavailable as err:
        return {"skipped": str(err)}


def weights_read(cfg: dict) -> int:
    """Weights one decode step reads: every layer's matrices and the LM head (the embedding gives one row;
    norms and biases are negligible)."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or h // heads
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * inter
    return layers * per_layer + cfg["vocab_size"] * h


def kv_bytes(cfg: dict, context: int) -> int:
    """The f32 KV cache read by one decode step at ``context`` positions."""
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return 2 * cfg["num_hidden_layers"] * kv * hd * context * 4


def bound_tps(cfg: dict, fmt: str, gbs: float, context: int, engine: str = "") -> float:
    """Decode tokens/s at most, reading the weights in ``fmt`` (as ``engine`` stores it) and the cache at ``gbs``
    GB/s."""
    return gbs * 1e9 / (weights_read(cfg) * width(engine, fmt) + kv_bytes(cfg, context))


def summarise(runs: list[dict], prompts: list[int], new: int, bound: float = float("inf")) -> dict:
    """A cell's figures over its rounds: best prefill, best and median decode (rounds above ``bound``, the
    bandwidth bound, left out of both and counted in ``glitches``), largest peak RSS, the last round's tokens."""
    ttft = {p: min(r["ttft_s"][str(p)] for r in runs) for p in prompts}
    rates = [round_decode_tps(r, new, prompts[0]) for r in runs]
    sane = [x for x in rates if x <= bound]
    return {"prefill_tps": {p: p / ttft[p] for p in prompts}, "ttft_s": ttft[prompts[0]],
            "decode_tps": max(sane) if sane else float("nan"),
            "decode_median_tps": float(np.median(sane)) if sane else float("nan"),
            "glitches": [x for x in rates if x > bound],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs), "load_s": min(r["load_s"] for r in runs),
            "tokens": runs[-1]["tokens"], "logits": runs[-1].get("logits")}


def token_match(tokens: list[int], ref: list[int]) -> str:
    if tokens == ref:
        return f"yes ({len(ref)})"
    first = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), min(len(tokens), len(ref)))
    return f"no (from token {first})"


def logits_error(path: str | None, ref_path: str) -> str:
    if not path:
        return "—"
    got, ref = np.load(path), np.load(ref_path)
    if got.shape != ref.shape:
        return f"shape {got.shape} vs {ref.shape}"
    return f"{float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))):.1e}"


# ------------------------------------------------------------------------------------------------
# Orchestrator


class Bench:
    """Prepares each model's files, runs the interleaved rounds and renders the tables."""

    def __init__(self, args, keep: str):
        self.args, self.keep = args, keep
        self.threads = [int(t) for t in args.threads.split(",")]
        self.prompts = [int(p) for p in args.prompts.split(",")]
        self.cells = parse_cells(args.engines, args.formats)
        self.started = time.time()
        #: the interpreter of each engine's workers (None: this one)
        self.python = {engine: args.genai_python for engine in GENAI_ENGINES}
        self.bandwidth = {} if args.prepare_only else {t: _spawn(["--bandwidth", str(t)], t, 600)
                                                       for t in self.threads}
        self.lines = [f"## Generation benchmark{' (--small configs)' if args.small else ''}", "",
                      f"Machine: {machine()}", "", versions_line(args.genai_python, args.optimum_cli), "",
                      f"Prompt {'/'.join(map(str, self.prompts))} tokens, {args.new} new, batch 1, greedy; "
                      f"threads {args.threads}; best of {args.rounds} interleaved round(s).", ""]
        self.lines += self.bandwidth_lines()

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.started:7.0f}s] {msg}", file=sys.stderr, flush=True)

    def spec(self, model: str, hf: str, cfg: dict, **kw) -> dict:
        out = os.path.join(self.keep, self.model_dir(model), "out")
        os.makedirs(out, exist_ok=True)
        return dict(hf=hf, files=os.path.dirname(out), out=out, vocab_size=cfg["vocab_size"],
                    prompts=self.prompts, new=self.args.new, reps=self.args.reps, **kw)

    def model_dir(self, model: str) -> str:
        return model + ("_small" if self.args.small else "")

    def prepare(self, model: str) -> tuple[str, dict]:
        hf = os.path.join(self.keep, self.model_dir(model), "hf")
        if not os.path.exists(os.path.join(hf, "config.json")):
            self.log(f"{model}: saving the random-weight model to {hf}")
            save_model(model, self.args.small, hf)
        with open(os.path.join(hf, "config.json")) as f:
            return hf, json.load(f)

    def prepare_files(self, model: str) -> tuple[str, dict, dict[tuple[str, str], str]]:
        """The model's Hugging Face folder and every cell's files (each written once); the HF folder, its
        config and the cells that cannot run, with why."""
        hf, cfg = self.prepare(model)
        skipped: dict[tuple[str, str], str] = {}
        for engine, fmt in self.cells:
            t0 = time.time()
            r = _spawn(["--files", json.dumps(self.spec(model, hf, cfg, engine=engine, format=fmt))], 2,
                       self.args.timeout, self.python.get(engine))
            if "files" not in r:
                skipped[(engine, fmt)] = r.get("skipped") or r.get("error")
                self.log(f"{model} {engine} {fmt}: skipped: {skipped[(engine, fmt)]}")
            else:
                self.log(f"{model} {engine} {fmt}: files {r['files']} ({time.time() - t0:.0f} s)")
        return hf, cfg, skipped

    def run_model(self, model: str) -> None:
        hf, cfg, skipped = self.prepare_files(model)
        if self.args.prepare_only:
            self.lines += [f"### {model}: files prepared", ""] + [
                f"- cannot run: {LABELS[e]} {f}: {' | '.join(str(why).splitlines())}" for (e, f), why in skipped.items()]
            return
        ref = _spawn(["--reference", json.dumps(self.spec(model, hf, cfg, threads=max(self.threads)))],
                     max(self.threads), self.args.timeout)
        runs: dict[tuple[str, str, int], list[dict]] = {}
        for rnd in range(self.args.rounds):
            for t in self.threads:
                for engine, fmt in rotated(self.cells, rnd):
                    if (engine, fmt) in skipped:
                        continue
                    # the last process is gone, but let its threads' CPUs (ONNX Runtime's pool spins after
                    # a run) and the pages it freed settle before the next one starts
                    time.sleep(self.args.pause)
                    wait_quiet(self.args.quiet_wait)
                    spec = self.spec(model, hf, cfg, engine=engine, format=fmt, threads=t)
                    r = _spawn(["--measure", json.dumps(spec)], t, self.args.timeout, self.python.get(engine))
                    if "ttft_s" not in r:
                        skipped[(engine, fmt)] = r.get("skipped") or r.get("error")
                        self.log(f"{model} {engine} {fmt} {t} threads: {skipped[(engine, fmt)]}")
                        continue
                    runs.setdefault((engine, fmt, t), []).append(r)
                    self.log(f"{model} round {rnd + 1} {engine} {fmt} {t} threads: decode "
                             f"{round_decode_tps(r, self.args.new, self.prompts[0]):.1f} tok/s "
                             f"(load average {os.getloadavg()[0]:.1f} after it)")
        self.lines += self.model_lines(model, cfg, ref, runs, skipped)

    def bandwidth_lines(self) -> list[str]:
        lines = ["| Threads | read GB/s | copy GB/s (read + write) |", "|---|---|---|"]
        for t, bw in self.bandwidth.items():
            if "error" in bw:
                lines.append(f"| {t} | {bw['error']} | |")
            else:
                lines.append(f"| {t} | {bw['read_gbs']:.1f} | {bw['copy_gbs']:.1f} |")
        return ["Memory bandwidth (numpy, each thread on its share of 512 MiB, best of 5):", ""] + lines + [""]

    def model_lines(self, model, cfg, ref, runs, skipped) -> list[str]:
        p0, new = self.prompts[0], self.args.new
        ctx = p0 + new // 2
        lines = [f"### {model}" + (" (small)" if self.args.small else ""), "",
                 f"{cfg['architectures'][0]}: {cfg['num_hidden_layers']} layers, width {cfg['hidden_size']}, "
                 f"heads {cfg['num_attention_heads']}/{cfg.get('num_key_value_heads')}, MLP "
                 f"{cfg['intermediate_size']}, vocabulary {cfg['vocab_size']}; {weights_read(cfg) / 1e6:.1f} M "
                 f"weights read per token (+ {kv_bytes(cfg, ctx) / 2**20:.1f} MiB f32 KV cache at {ctx} positions).", ""]
        if "error" in ref:
            lines += [f"Reference (transformers f32) failed: {ref['error']}", ""]
        else:
            lines += [f"Reference: transformers f32; top-2 logit gap after the prompt {ref['top2_gap']:.2e}.", ""]
        head = " | ".join(f"prefill {p} tok/s" for p in self.prompts)
        lines += [f"| Engine | Format | Threads | {head} | TTFT {p0} ms | decode tok/s best | median "
                  f"| bound tok/s | % of bound | peak RSS MiB | logits err vs f32 | tokens = transformers f32 | load s |",
                  "|---|---|---|" + "---|" * (len(self.prompts) + 9)]
        glitches: list[str] = []
        for (engine, fmt, t), rs in sorted(runs.items(), key=lambda kv: (kv[0][2], list(ENGINES).index(kv[0][0]))):
            bw = self.bandwidth.get(t, {})
            bound = bound_tps(cfg, fmt, bw["read_gbs"], ctx, engine) if "read_gbs" in bw else float("nan")
            s = summarise(rs, self.prompts, new, 2 * bound if bound == bound else float("inf"))
            if s["glitches"]:
                glitches.append(f"- {LABELS[engine]} {fmt} {t} threads: round(s) at "
                                f"{', '.join(f'{g:.1f}' for g in s['glitches'])} tok/s, above the bound "
                                f"{bound:.1f} twice over: a timing glitch, left out")
            match = "—" if "error" in ref else token_match(s["tokens"], ref["tokens"])
            err = "—" if "error" in ref else logits_error(s["logits"], ref["logits"])
            pre = " | ".join(f"{s['prefill_tps'][p]:.0f}" for p in self.prompts)
            lines.append(f"| {LABELS[engine]} | {fmt} | {t} | {pre} | {s['ttft_s'] * 1e3:.1f} | "
                         f"{s['decode_tps']:.1f} | {s['decode_median_tps']:.1f} | {bound:.1f} | {100 * s['decode_tps'] / bound:.0f}% | "
                         f"{s['peak_rss_mib']:.0f} | {err} | {match} | {s['load_s']:.1f} |")
        lines.append("")
        lines += glitches
        for (engine, fmt), why in skipped.items():
            lines.append(f"- not run: {LABELS[engine]} {fmt}: {' | '.join(str(why).splitlines())}")
        return lines + [""]


def rotated(cells: list, rnd: int) -> list:
    """The cells in round ``rnd``'s order: rotated by one each round, so that no engine always runs right
    after the same one."""
    k = rnd % max(1, len(cells))
    return cells[k:] + cells[:k]


def parse_cells(engines: str, formats: str) -> list[tuple[str, str]]:
    """(engine, format) pairs: each engine of ``engines`` with its default formats, or those ``formats`` names
    for it (``"llama_cpp=f32,q8_0 ort_genai=fp32"``)."""
    chosen = {}
    for item in formats.split():
        engine, _, fmts = item.partition("=")
        if engine not in ENGINES:
            raise SystemExit(f"--formats: unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        chosen[engine] = fmts.split(",")
    cells = []
    for engine in engines.split(","):
        if engine not in ENGINES:
            raise SystemExit(f"--engines: unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        for fmt in chosen.get(engine, ENGINES[engine][2]):
            if fmt not in ENGINES[engine][1]:
                raise SystemExit(f"--formats: {engine} has no format {fmt!r} (it has {', '.join(ENGINES[engine][1])})")
            cells.append((engine, fmt))
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--formats", default="", help='per engine, e.g. "llama_cpp=f32,q4_0 ort_genai=fp32"')
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", default="128,1024", help="prompt lengths (the first one also starts the decode)")
    ap.add_argument("--new", type=int, default=128, help="new tokens of the decode measurement")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (fresh processes)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each measurement inside a process")
    ap.add_argument("--small", action="store_true", help="2-layer configs of width 64: a smoke run")
    ap.add_argument("--keep", metavar="DIR", help="where the models and every engine's files are kept (reused)")
    ap.add_argument("--quiet-wait", type=float, default=5.0, help="wait up to this long for idle CPUs per cell")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds allowed to each process")
    ap.add_argument("--markdown", metavar="FILE", help="append the report to FILE")
    ap.add_argument("--optimum-cli", metavar="PATH", default=os.environ.get("OPTIMUM_CLI"),
                    help="optimum-cli of another environment for the OpenVINO export (sets $OPTIMUM_CLI)")
    ap.add_argument("--genai-python", metavar="PATH", default=os.environ.get("GENAI_PYTHON"),
                    help="the interpreter that runs the ort_genai and openvino_genai workers (default $GENAI_PYTHON, "
                         "else this one): an environment with onnxruntime-genai / openvino-genai on top of ours")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds of rest before each cell's process")
    ap.add_argument("--prepare-only", action="store_true",
                    help="write every model's Hugging Face folder and engine files into --keep, measure nothing")
    ap.add_argument("--versions", help=argparse.SUPPRESS)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--bandwidth", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for flag, fn in (("measure", measure_worker), ("reference", reference_worker), ("files", files_worker)):
        if getattr(args, flag):
            print(json.dumps(fn(json.loads(getattr(args, flag)))))
            return 0
    if args.bandwidth:
        print(json.dumps(bandwidth_worker(args.bandwidth)))
        return 0
    if args.versions:
        print(json.dumps({"versions": package_versions(args.versions.split(","))}))
        return 0
    for name in args.models.split(","):
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the bandwidth test's threads are its own
    if args.optimum_cli:
        os.environ["OPTIMUM_CLI"] = args.optimum_cli
    keep = args.keep or tempfile.mkdtemp(prefix="generate-")
    bench = Bench(args, os.path.abspath(keep))
    try:
        for model in args.models.split(","):
            bench.run_model(model)
    finally:
        report = "\n".join(bench.lines) + "\n"
        print(report)
        if args.markdown:
            with open(args.markdown, "a") as f:
                f.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
