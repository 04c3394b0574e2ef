"""Serving on Ray Serve: throughput and latency at 1, 2 and 4 replicas x threads, with and without
batching, byoc-hetero against ONNX Runtime in the same deployment (issue 28).

One CNN (ResNet-style blocks on 3x128x128 images, dynamic batch) is exported to ONNX once; byoc-hetero
serves ``bh.from_onnx`` of that file, partitioned and exported with ``byoc_hetero.serve.export``;
ONNX Runtime serves the file itself (``engine="onnxruntime"``, ``intra_op_num_threads`` from the
same CPU budget). Both answer every request of the run; each answer is checked against a direct run.

For each configuration (engine x replicas x CPUs per replica x batching) the app is deployed on a
local Ray (127.0.0.1 only), warmed up, then ``--concurrency`` client threads send one-image requests
until ``--requests`` answers or ``--seconds`` have passed, whichever comes first. Reported: answers
per second, p50 and p99 latency seen by the client, the mean rows per model call (batching), errors.
The client runs on the same machine and takes CPU too. Asserts nothing; not part of the tests.

    python3 bench/serve.py --markdown bench/SERVE.md

``--protocol v2`` measures the Open Inference Protocol path instead: one deployment serves both engines
as two models (``byoc`` and ``onnxruntime``), and ``tritonclient.http`` clients (binary tensors, one
client per thread) load each model in turn at 1, 8 and 32 client threads (``--v2-concurrency``).

``--protocol openai`` measures the LLM path: a random Llama (``--llm-size``: hidden, layers; the weights
do not matter to the time) built with ``bh.llm.from_hf`` and saved as a generator folder, served on the
OpenAI API; ``openai`` clients send greedy completions of token-id prompts (8 to 31 tokens, ``--llm-tokens``
new tokens each) at 1 and 8 client threads, with continuous batching (``llm_slots=8``) and sequentially
(``llm_slots=1``: one request decodes at a time). Every answer's tokens are checked against
``Generator.generate`` run directly.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import byoc_hetero as bh  # noqa: E402
from byoc_hetero import serve as bs  # noqa: E402


def _model(tmp: Path) -> Path:
    import torch

    class Block(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):
            return torch.relu(x + self.b(torch.relu(self.a(x))))

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.ReLU(), Block(32),
                              torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(), Block(64),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).eval()
    path = tmp / "cnn.onnx"
    torch.onnx.export(net, (torch.randn(2, 3, 128, 128),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, dynamo=False, opset_version=17)
    return path


def _load(send, want: list[np.ndarray], args, concurrency: int) -> dict:
    """Call ``send(i) -> (status, output, batch_rows)`` from ``concurrency`` threads until the count or the
    time is reached; every answer is checked against ``want[i % len(want)]``."""
    latencies, rows, errors, wrong = [], [], 0, 0
    start = time.perf_counter()
    stop = start + args.seconds

    def one(i: int):
        if time.perf_counter() > stop:
            return None
        t = time.perf_counter()
        answer = send(i)
        return i, time.perf_counter() - t, answer

    with ThreadPoolExecutor(concurrency) as pool:
        for result in pool.map(one, range(args.requests)):
            if result is None:
                continue
            i, seconds, (status, output, batch_rows) = result
            if status != 200:
                errors += 1
                continue
            if not np.allclose(output, want[i % len(want)], rtol=1e-4, atol=1e-4):
                wrong += 1
            latencies.append(seconds)
            rows.append(batch_rows)
    elapsed = time.perf_counter() - start
    lat = np.array(latencies or [float("nan")]) * 1e3
    return {"answers": len(latencies), "per_s": len(latencies) / elapsed, "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "rows": float(np.mean(rows)) if rows else 0.0,
            "errors": errors, "wrong": wrong}


def _legacy_sender(url: str, xs: list[np.ndarray]):
    def send(i: int):
        answer = bs.post(url, xs[i % len(xs)], timeout=60)
        return answer.status, answer.output, answer.batch_rows
    return send


def _v2_sender(host: str, model: str, xs: list[np.ndarray]):
    """KServe v2 through tritonclient (binary tensors, its default), one client per thread."""
    import threading

    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    local = threading.local()
    name = httpclient.InferenceServerClient(host).get_model_metadata(model)["inputs"][0]["name"]

    def send(i: int):
        if not hasattr(local, "client"):
            local.client = httpclient.InferenceServerClient(host, network_timeout=60.0)
        x = xs[i % len(xs)]
        inp = httpclient.InferInput(name, list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        try:
            result = local.client.infer(model, [inp])
        except InferenceServerException as err:
            return int(err.status() or 0), None, 0
        return 200, result.as_numpy(result.get_response()["outputs"][0]["name"]), \
            result.get_response()["parameters"]["batch_rows"]
    return send


def _direct(lib: Path, onnx_path: Path, rounds: int = 5) -> list[tuple[str, int, int, float]]:
    """Median latency of one in-process call per engine, batch 1 and 8, 1 and 2 threads: what the model
    costs without Serve (engines interleaved, best of ``rounds`` medians)."""
    import onnxruntime as ort

    from byoc_hetero import _C

    out = []
    for threads in (1, 2):
        _C.set_num_threads(threads)
        vm = bh.vm(__import__("tvm").runtime.load_module(str(lib)))  # modules loaded now get `threads`
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        for batch in (1, 8):
            x = np.random.default_rng(batch).standard_normal((batch, 3, 128, 128)).astype("float32")
            calls = {"byoc": lambda: vm["main"](x), "onnxruntime": lambda: sess.run(None, {"x": x})}
            best = {k: float("inf") for k in calls}
            for _ in range(rounds):
                for name, call in calls.items():
                    call()
                    times = []
                    for _ in range(10):
                        t = time.perf_counter()
                        call()
                        times.append(time.perf_counter() - t)
                    best[name] = min(best[name], float(np.median(times)))
            out += [(name, threads, batch, best[name] * 1e3) for name in calls]
    _C.set_num_threads(os.cpu_count() or 1)
    return out


def _configs(args) -> list[tuple[str, int, int, bool]]:
    out = []
    for replicas, cpus in (tuple(map(int, c.split("x"))) for c in args.splits.split(",") if c):
        for batch in (False, True):
            for engine in args.engines.split(","):
                out.append((engine, replicas, cpus, batch))
    return out


def _machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                  .stdout.splitlines() if ln.startswith("Model name")), platform.processor())
    return (f"{model}, {os.cpu_count()} vCPUs, oneDNN {bh._C.onednn_version()} ISA {bh._C.isa()}, "
            f"load average at start {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", default="1x1,1x2,2x1,4x1", help="REPLICASxCPUS, comma-separated")
    parser.add_argument("--engines", default="byoc,onnxruntime")
    parser.add_argument("--requests", type=int, default=300, help="answers per configuration (at most)")
    parser.add_argument("--seconds", type=float, default=20.0, help="time per configuration (at most)")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads")
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--protocol", choices=("legacy", "v2", "openai"), default="legacy",
                        help="v2: both engines as two models of one deployment, driven over KServe v2 by "
                             "tritonclient at each of --v2-concurrency")
    parser.add_argument("--v2-concurrency", default="1,8,32", help="client threads of the v2 runs")
    parser.add_argument("--llm-size", default="256,4", help="openai: hidden size, layers of the random Llama")
    parser.add_argument("--llm-tokens", type=int, default=32, help="openai: new tokens per request")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    machine, started = _machine(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    tmp = Path(tempfile.mkdtemp())
    if args.protocol == "openai":
        _report_llm(_run_llm(args, tmp), machine, started, args)
        return
    onnx_path = _model(tmp)
    mod, params = bh.from_onnx(onnx_path, dim_ranges={"N": (1, 64)})
    lib = bs.export(bh.partition(mod, params), tmp / "cnn.so")
    direct = bh.vm(__import__("tvm").runtime.load_module(str(lib)))
    xs = [np.random.default_rng(i).standard_normal((1, 3, 128, 128)).astype("float32") for i in range(32)]
    want = [direct["main"](x).numpy() for x in xs]
    direct_rows = _direct(lib, onnx_path)
    for row in direct_rows:
        print("direct", row, flush=True)
    configs = _configs(args)
    max_cpus = max((r * c for _, r, c, _ in configs), default=1)
    if args.protocol == "v2":
        rows = _run_v2(args, {"byoc": lib, "onnxruntime": onnx_path}, xs, want, max_cpus)
        bs.shutdown()
        _report_v2(rows, direct_rows, machine, started, args)
        return
    rows = []
    for engine, replicas, cpus, batch in configs:
        path = lib if engine == "byoc" else onnx_path
        application = bs.app(path, engine=engine, replicas=replicas, cpus=cpus, batch=batch, max_batch_rows=8,
                             batch_wait_s=0.002)
        bs.start(application, port=args.port, num_cpus=max_cpus)
        for x in xs[:4]:
            bs.post(f"http://127.0.0.1:{args.port}/", x)  # warm-up: plans, first calls
        result = _load(_legacy_sender(f"http://127.0.0.1:{args.port}/", xs), want, args, args.concurrency)
        rows.append((engine, replicas, cpus, batch, result))
        print(engine, replicas, cpus, batch, {k: round(v, 2) for k, v in result.items()}, flush=True)
        from ray import serve

        serve.delete("byoc_hetero")
    bs.shutdown()
    _report(rows, direct_rows, machine, started, args)


def _run_v2(args, models: dict[str, Path], xs, want, max_cpus: int) -> list[tuple]:
    """Per split and batching: one deployment serving both engines' models; each model under each
    concurrency of ``--v2-concurrency``, engines alternating."""
    from ray import serve

    rows = []
    host = f"127.0.0.1:{args.port}"
    for replicas, cpus, batch in sorted({(r, c, b) for _, r, c, b in _configs(args)}, key=lambda t: (t[0], t[1], t[2])):
        bs.start(bs.app({k: str(v) for k, v in models.items()}, replicas=replicas, cpus=cpus, batch=batch,
                        max_batch_rows=8, batch_wait_s=0.002), port=args.port, num_cpus=max_cpus)
        senders = {engine: _v2_sender(host, engine, xs) for engine in models}
        for send in senders.values():
            for i in range(4):
                send(i)  # warm-up: plans, first calls
        for concurrency in (int(c) for c in args.v2_concurrency.split(",")):
            for engine, send in senders.items():
                result = _load(send, want, args, concurrency)
                rows.append((engine, replicas, cpus, batch, concurrency, result))
                print("v2", engine, replicas, cpus, batch, concurrency, {k: round(v, 2) for k, v in result.items()},
                      flush=True)
        serve.delete("byoc_hetero")
    return rows


LLM_SLOTS = {"continuous batching": 8, "sequential": 1}
"""The openai runs: scheduler slots of each way of serving."""


def _llm(args, tmp: Path) -> tuple[Path, list[list[int]], list[np.ndarray]]:
    """A random Llama saved as a generator folder, prompts of token ids, and the tokens of each, greedy."""
    import torch
    import transformers

    hidden, layers = (int(v) for v in args.llm_size.split(","))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=2048, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4)
    gen = bh.llm.from_hf(transformers.LlamaForCausalLM(config).eval(), max_length=32 + args.llm_tokens)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 2048, int(rng.integers(8, 32))).tolist() for _ in range(16)]
    want = [gen.generate([np.array(p)], max_new_tokens=args.llm_tokens)[0][len(p):] for p in prompts]
    return gen.save(tmp / "llm"), prompts, want


def _openai_sender(host: str, prompts: list[list[int]], tokens: int):
    """Greedy completions through the openai client, one client per thread."""
    import threading

    import openai

    local = threading.local()

    def send(i: int):
        if not hasattr(local, "client"):
            local.client = openai.OpenAI(base_url=f"http://{host}/v1", api_key="none", timeout=120, max_retries=0)
        try:
            answer = local.client.completions.create(model="llm", prompt=prompts[i % len(prompts)],
                                                     max_tokens=tokens, temperature=0)
        except openai.APIStatusError as err:
            return err.status_code, None, 0
        return 200, np.array(answer.choices[0].token_ids), answer.model_extra["batch_sequences_max"]
    return send


def _run_llm(args, tmp: Path) -> list[tuple]:
    from ray import serve

    folder, prompts, want = _llm(args, tmp)
    rows = []
    for way, slots in LLM_SLOTS.items():
        for attempt in range(3):  # Ray's fixed 30 s wait for its node can run out on a loaded machine
            try:
                bs.start(bs.app({"llm": str(folder)}, llm_slots=slots), port=args.port, num_cpus=2)
                break
            except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for this
                if "timed out during startup" not in str(err) or attempt == 2:
                    raise
                __import__("ray").shutdown()
        send = _openai_sender(f"127.0.0.1:{args.port}", prompts, args.llm_tokens)
        for i in range(2):
            send(i)  # warm-up
        for concurrency in (1, 8):
            result = _load(send, want, args, concurrency)
            rows.append((way, concurrency, result))
            print("openai", way, concurrency, {k: round(v, 2) for k, v in result.items()}, flush=True)
        serve.delete("byoc_hetero")
    bs.shutdown()
    return rows


def _report_llm(rows, machine: str, started: str, args) -> None:
    lines = ["## The LLM path (`--protocol openai`)", "", _machine_line(machine, started), "",
             f"Run: `python3 bench/serve.py --protocol openai --llm-size {args.llm_size} --llm-tokens "
             f"{args.llm_tokens} --requests {args.requests} --seconds {args.seconds}`. A random Llama (hidden, "
             f"layers = {args.llm_size}, vocab 2048, f32) served as a generator folder on one replica of 1 CPU; "
             "`openai` clients send greedy completions of token-id prompts (8-31 tokens), "
             f"{args.llm_tokens} new tokens each. Continuous batching: 8 scheduler slots; sequential: 1. "
             "`sequences per step`: the mean of each answer's `batch_sequences_max`. Every answer's tokens are "
             "checked against `Generator.generate` run directly (`wrong`).", "",
             "| serving | clients | requests/s | tokens/s | p50 ms | p99 ms | sequences per step | answers | errors "
             "| wrong |", "|---|---|---|---|---|---|---|---|---|---|"]
    for way, concurrency, r in rows:
        lines.append(f"| {way} | {concurrency} | {r['per_s']:.2f} | {r['per_s'] * args.llm_tokens:.1f} | "
                     + _cells(r).split(" | ", 1)[1])
    _write(lines, args)


def _direct_table(direct_rows) -> list[str]:
    lines = ["", "The model without Serve, in this process before the deployments (median of 10 calls, best of "
             "5 interleaved rounds), ms per call:", "", "| threads | batch | byoc-hetero | ONNX Runtime | ONNX Runtime / ours |",
             "|---|---|---|---|---|"]
    table = {(e, t, b): ms for e, t, b, ms in direct_rows}
    for threads, batch in sorted({(t, b) for _, t, b, _ in direct_rows}):
        ours, ort_ms = table[("byoc", threads, batch)], table[("onnxruntime", threads, batch)]
        lines.append(f"| {threads} | {batch} | {ours:.2f} | {ort_ms:.2f} | {ort_ms / ours:.2f}x |")
    return lines


def _report_v2(rows, direct_rows, machine: str, started: str, args) -> None:
    lines = ["## The Open Inference Protocol path (`--protocol v2`)", "",
             _machine_line(machine, started), "",
             f"Run: `python3 bench/serve.py --protocol v2 --splits {args.splits} --requests {args.requests} "
             f"--seconds {args.seconds} --v2-concurrency {args.v2_concurrency}`. One deployment serves both "
             "engines as two models (`byoc`: the library, `onnxruntime`: the ONNX file); `tritonclient.http` "
             "clients (one per thread, binary tensors) send one-image requests to `/v2/models/{model}/infer`, "
             "the engines alternating at each concurrency. Every answer is checked against a direct run.", "",
             "| model | replicas x CPUs | batching | clients | answers/s | p50 ms | p99 ms | rows per call | answers | errors | wrong |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for engine, replicas, cpus, batch, concurrency, r in rows:
        lines.append(f"| {engine} | {replicas}x{cpus} | {'yes' if batch else 'no'} | {concurrency} | {_cells(r)}")
    _write(lines + _direct_table(direct_rows), args)


def _machine_line(machine: str, started: str) -> str:
    return (f"Machine: {machine}. Started {started}; Ray Serve {__import__('ray').__version__}. The machine was "
            "shared with other work (loaded): compare rows of one run, not with other runs.")


def _cells(r: dict) -> str:
    """A result's cells: answers/s, p50, p99, rows per call, answers, errors, wrong."""
    return (f"{r['per_s']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['rows']:.2f} | {r['answers']} | "
            f"{r['errors']} | {r['wrong']} |")


def _write(lines: list[str], args) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


def _report(rows, direct_rows, machine: str, started: str, args) -> None:
    lines = ["# Serving on Ray Serve (`bench/serve.py`)", "",
             _machine_line(machine, started), "",
             f"Run: `python3 bench/serve.py --splits {args.splits} --requests {args.requests} --seconds "
             f"{args.seconds} --concurrency {args.concurrency}`. One-image requests (1x3x128x128, a ResNet-style "
             "CNN), sent over HTTP on 127.0.0.1 by client threads on the same machine. Ray schedules against "
             f"{max((r * c for _, r, c, _, _ in rows), default=1)} logical CPUs, so 4 replicas oversubscribe the "
             f"{os.cpu_count()} vCPUs. Batching: `@serve.batch`, at most 8 rows, 2 ms wait. Every answer is "
             "checked against a direct run of the library (`wrong` counts mismatches).", "",
             "| engine | replicas x CPUs | batching | answers/s | p50 ms | p99 ms | rows per call | answers | errors | wrong |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for engine, replicas, cpus, batch, r in rows:
        lines.append(f"| {engine} | {replicas}x{cpus} | {'yes' if batch else 'no'} | {_cells(r)}")
    _write(lines + _direct_table(direct_rows), args)


if __name__ == "__main__":
    main()
