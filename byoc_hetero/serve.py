"""Serving an exported library on Ray Serve (``pip install "byoc-hetero[serve]"``).

One process or machine is not enough any more: put the model behind Ray Serve. Each replica is a Ray
actor with a CPU budget (``cpus``); the runtime's threads are set from it before the library loads
(``BYOC_HETERO_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``TVM_NUM_THREADS`` in the replica's environment,
and :func:`byoc_hetero._C.set_num_threads`), so replicas on one machine do not oversubscribe it.

With ``batch=True`` the replica groups concurrent requests with Ray Serve's ``@serve.batch``: the
rows of requests of the same trailing shape are concatenated along axis 0, run in one call of a
symbolic-batch build (one library serves every batch size) and split again. The batch is bounded in
*rows* (``max_batch_rows``), which must fit the batch dim's declared range.

Requests: ``POST /`` with a ``.npy`` body (one input; the answer is ``.npy``), an ``.npz`` body (several
inputs in order; the answer is ``.npy`` of the first output), or JSON ``{"inputs": [nested lists],
"dtypes": [...]}`` (dtypes default to the signature's; the answer is ``{"outputs": [...], "shape": ...,
"dtype": ...}``). A request whose count, shape or dtype does not match the library's signature gets
HTTP 400 with the :class:`~byoc_hetero.errors.InputError` text; it never reaches the model, so it
cannot crash a replica or spoil a batch. The answer's header ``x-batch-rows`` says how many rows the
call that computed it had. ``GET /info`` tells a replica's engine, threads and pid.

Failures are bounded: Serve's proxy answers HTTP 408 to a request it has no answer for within
``request_timeout_s`` (:func:`start`, 30 s by default; Ray's own default is no bound), and the controller
health-checks replicas every :data:`HEALTH_CHECK_PERIOD_S`, replacing a dead one at the first failed check.
Requests a dying replica had accepted fail with HTTP 500; none is answered wrongly.

The library must carry its input signature: build it with :func:`export` (or ``bh.compile`` of a
placed module). ``engine="onnxruntime"`` serves an ``.onnx`` file the same way (the benchmark's
reference, with ``intra_op_num_threads`` from the same budget).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ByocError, InputError
from .inputs import TensorSpec, check

try:
    import ray
    from ray import serve
except ImportError as _err:  # the extra is optional
    raise ByocError("byoc_hetero.serve needs Ray Serve: pip install \"byoc-hetero[serve]\" "
                    "(or \"ray[serve]\")") from _err

HEALTH_CHECK_PERIOD_S = 2.0
"""How often Ray Serve's controller checks each replica. The controller starts a replacement for a dead
replica only when a check fails, so this bounds how long a killed replica goes unnoticed (Ray's default,
10 s, kept the deployment one replica short for up to 10 s before the replacement even began starting)."""

REQUEST_TIMEOUT_S = 30.0
"""Default end-to-end bound on one HTTP request in Serve's proxy (:func:`start`): a request that has no
answer by then gets HTTP 408 from the proxy instead of waiting for the client to give up. Ray Serve sets
no bound by default, and its router retries placing a request for as long as no replica accepts it."""

PROXY_READY_CHECK_TIMEOUT_S = 20.0
"""How long Serve's controller waits for the HTTP proxy's readiness check (``RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S``,
set for the Ray that :func:`start` starts). The controller restarts a proxy that misses three checks in a row;
Ray's 5 s default gave a new proxy process 16 s to start, which it missed on the 2-vCPU machine under load
(load average 10-12), and every restart began again from nothing until ``serve.start``'s own 60 s wait gave up.
Three checks of 20 s match that wait."""

THREAD_ENV = ("BYOC_HETERO_NUM_THREADS", "OMP_NUM_THREADS", "TVM_NUM_THREADS", "MKL_NUM_THREADS")
"""Set to a replica's CPU budget in its environment: the runtime, libgomp and TVM's pool read them."""


@dataclass(frozen=True)
class ServeConfig:
    """What one deployment serves and how (see :func:`app`)."""

    path: str
    engine: str = "byoc"
    replicas: int = 1
    cpus: int = 1
    batch: bool = False
    max_batch_rows: int = 16
    batch_wait_s: float = 0.005
    entry: str = "main"


# -- engines: load a model, check inputs, run -------------------------------------------------------

class _ByocEngine:
    """An exported byoc-hetero library (with its placement plan: the input signature and ranges)."""

    def __init__(self, config: ServeConfig) -> None:
        import tvm

        from . import _C
        from .placement import vm

        _C.set_num_threads(config.cpus)  # for the modules loaded next (the environment says the same)
        try:
            self._vm = vm(tvm.runtime.load_module(config.path))
        except ByocError as err:
            raise ByocError(f"{config.path}: {err}; export it with byoc_hetero.serve.export(module, path)") from err
        self.entry = config.entry
        self.specs = self._vm.input_specs(self.entry)
        self.ranges = self._vm.dim_ranges(self.entry)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        out = self._vm[self.entry](*inputs)
        return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64",
               "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(float16)": "float16"}


class _OrtEngine:
    """An ONNX file on ONNX Runtime's CPU provider, checked with the same signature rules."""

    def __init__(self, config: ServeConfig) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = config.cpus, 1
        self._sess = ort.InferenceSession(config.path, opts, providers=["CPUExecutionProvider"])
        self._names = [i.name for i in self._sess.get_inputs()]
        self.entry, self.ranges = config.entry, {}
        self.specs = [TensorSpec(i.name, _ORT_DTYPES.get(i.type),
                                 tuple(d if isinstance(d, int | str) else None for d in i.shape))
                      for i in self._sess.get_inputs()]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(self._sess.run(None, dict(zip(self._names, inputs))))


def load_engine(config: ServeConfig):
    """The engine of ``config`` (``"byoc"`` or ``"onnxruntime"``), loaded in this process."""
    engines = {"byoc": _ByocEngine, "onnxruntime": _OrtEngine}
    if config.engine not in engines:
        raise ByocError(f"engine must be one of {sorted(engines)}, got {config.engine!r}")
    return engines[config.engine](config)


# -- the wire format -------------------------------------------------------------------------------

def decode(body: bytes, content_type: str, specs: list[TensorSpec | None]) -> tuple[list[np.ndarray], str]:
    """A request body as input arrays and the reply format (``"npy"`` or ``"json"``); InputError if
    it cannot be read."""
    if "json" in content_type:
        try:
            doc = json.loads(body)
            arrays, dtypes = doc["inputs"], doc.get("dtypes") or [s.dtype if s else None for s in specs]
            return [np.asarray(a, dtype=d) for a, d in zip(arrays, list(dtypes) + [None] * len(arrays))], "json"
        except (ValueError, KeyError, TypeError) as err:
            raise InputError(f"request: not JSON of the form {{'inputs': [...]}}: {err}") from err
    if not body.startswith((b"\x93NUMPY", b"PK")):
        raise InputError(f"request: the body is neither .npy, .npz nor JSON (content-type {content_type!r}, "
                         f"starts with {body[:8]!r})")
    try:
        loaded = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError) as err:
        raise InputError(f"request: unreadable .npy/.npz body: {err}") from err
    if isinstance(loaded, np.ndarray):
        return [loaded], "npy"
    return [loaded[k] for k in loaded.files], "npy"


def encode(outputs: list[np.ndarray], kind: str) -> tuple[bytes, str]:
    """The reply body and its content type."""
    if kind == "json":
        first = outputs[0]
        doc = {"outputs": [o.tolist() for o in outputs], "shape": list(first.shape), "dtype": str(first.dtype)}
        return json.dumps(doc).encode(), "application/json"
    buf = io.BytesIO()
    np.save(buf, outputs[0], allow_pickle=False)
    return buf.getvalue(), "application/octet-stream"


def run_batch(run, items: list[list[np.ndarray]]) -> list[tuple[list[np.ndarray], int]]:
    """Run requests as batches: those whose inputs agree on every dim but the first (and dtypes) are
    concatenated along axis 0, run in one call, and each output is split back by rows. Returns, per
    request, its outputs and the rows of the call it ran in."""
    groups: dict[tuple, list[int]] = {}
    for i, inputs in enumerate(items):
        groups.setdefault(tuple((x.shape[1:], str(x.dtype)) for x in inputs), []).append(i)
    answers: list[tuple[list[np.ndarray], int]] = [([], 0) for _ in items]
    for members in groups.values():
        rows = [int(items[i][0].shape[0]) for i in members]
        stacked = [np.concatenate([items[i][k] for i in members]) for k in range(len(items[members[0]]))]
        outputs = run(stacked)
        for out in outputs:
            if out.ndim == 0 or out.shape[0] != sum(rows):
                raise ByocError(f"batched output of shape {list(out.shape)} has no batch dim of {sum(rows)} "
                                "rows: serve this model with batch=False")
        for i, part in zip(members, zip(*(np.split(o, np.cumsum(rows)[:-1]) for o in outputs))):
            answers[i] = (list(part), sum(rows))
    return answers


# -- the replica -----------------------------------------------------------------------------------

def _rows(items: list[list[np.ndarray]]) -> int:
    return sum(int(x[0].shape[0]) if x and x[0].ndim else 1 for x in items)


class Replica:
    """One Ray Serve replica: an engine, its input checks, optional dynamic batching."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = ServeConfig(**config)
        self.engine = load_engine(self.config)
        self._pool = ThreadPoolExecutor(1)  # one call at a time per replica; the event loop stays free
        self._batched.set_max_batch_size(self.config.max_batch_rows)
        self._batched.set_batch_wait_timeout_s(self.config.batch_wait_s)

    def info(self) -> dict[str, Any]:
        from . import _C

        return {"engine": self.config.engine, "cpus": self.config.cpus, "runtime_threads": _C.num_threads(),
                "env": {k: os.environ.get(k) for k in THREAD_ENV}, "pid": os.getpid(),
                "batch": self.config.batch}

    def check(self, inputs: list[np.ndarray]) -> None:
        """InputError unless ``inputs`` match the signature (and, batching, fit one batch)."""
        check(self.engine.entry, self.engine.specs, inputs, self.engine.ranges)
        if self.config.batch and inputs and inputs[0].ndim and inputs[0].shape[0] > self.config.max_batch_rows:
            raise InputError(f"{self.engine.entry}: {inputs[0].shape[0]} rows in one request, more than "
                             f"max_batch_rows={self.config.max_batch_rows}")

    async def predict(self, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
        """Checked inputs -> outputs, and the rows of the call they ran in (through the batcher when
        batching)."""
        if self.config.batch:
            return await self._batched(inputs)
        outputs = await asyncio.get_running_loop().run_in_executor(self._pool, self.engine.run, inputs)
        return outputs, _rows([inputs])

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005, batch_size_fn=_rows)
    async def _batched(self, items: list[list[np.ndarray]]) -> list[tuple[list[np.ndarray], int]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, run_batch, self.engine.run, items)

    async def __call__(self, request) -> Any:
        from starlette.responses import JSONResponse, Response

        if request.method == "GET":
            return JSONResponse(self.info())
        try:
            inputs, kind = decode(await request.body(), request.headers.get("content-type", ""), self.engine.specs)
            self.check(inputs)
        except InputError as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        outputs, rows = await self.predict(inputs)
        body, content_type = encode(outputs, kind)
        return Response(body, media_type=content_type, headers={"x-batch-rows": str(rows)})


# -- deploying -------------------------------------------------------------------------------------

def _environment(cpus: int) -> dict[str, str]:
    """A replica's environment: thread counts from its CPU budget, and this byoc_hetero importable."""
    package_root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {**{k: str(cpus) for k in THREAD_ENV}, "PYTHONPATH": path}


def app(path: str | os.PathLike, *, engine: str = "byoc", replicas: int = 1, cpus: int = 1, batch: bool = False,
        max_batch_rows: int = 16, batch_wait_s: float = 0.005, name: str = "byoc_hetero") -> serve.Application:
    """A Ray Serve application serving the library (or, with ``engine="onnxruntime"``, the ONNX file) at
    ``path``: ``replicas`` replicas of ``cpus`` CPUs each (the runtime's threads), optionally batching
    concurrent requests up to ``max_batch_rows`` rows, waiting at most ``batch_wait_s`` for a batch."""
    if replicas < 1 or cpus < 1 or max_batch_rows < 1:
        raise ByocError(f"replicas, cpus and max_batch_rows must be >= 1, got {replicas}, {cpus}, {max_batch_rows}")
    if not Path(path).is_file():
        raise ByocError(f"no such file: {path}")
    config = ServeConfig(str(Path(path).resolve()), engine, replicas, cpus, batch, max_batch_rows, batch_wait_s)
    deployment = serve.deployment(Replica, name=name, num_replicas=replicas, max_ongoing_requests=4 * max_batch_rows,
                                  health_check_period_s=HEALTH_CHECK_PERIOD_S,
                                  ray_actor_options={"num_cpus": cpus,
                                                     "runtime_env": {"env_vars": _environment(cpus)}})
    return deployment.bind(asdict(config))


def start(application: serve.Application, *, port: int = 8000, name: str = "byoc_hetero",
          num_cpus: int | None = None,
          request_timeout_s: float | None = REQUEST_TIMEOUT_S) -> serve.handle.DeploymentHandle:
    """Start Ray (locally, if it is not running yet) and Serve's HTTP proxy on 127.0.0.1:``port``, then
    ``application`` at route ``/``; returns its handle once every replica is up.

    ``num_cpus`` is the CPU count Ray schedules replicas against (default: this machine's CPUs; more
    than that oversubscribes the cores, which a benchmark may want to show). ``request_timeout_s``
    bounds each HTTP request in the proxy (HTTP 408 past it; ``None``: unbounded, Ray's default); it
    applies when this call starts Serve's proxy."""
    if request_timeout_s is not None and request_timeout_s <= 0:
        raise ByocError(f"request_timeout_s must be > 0 or None, got {request_timeout_s}")
    if not ray.is_initialized():
        ready_check = os.environ.get("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_CHECK_TIMEOUT_S))
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": _environment(1)["PYTHONPATH"],
                                           "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": ready_check}})
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": request_timeout_s})
    return serve.run(application, name=name, route_prefix="/")


def shutdown() -> None:
    """Stop Serve and Ray (what :func:`start` started)."""
    serve.shutdown()
    ray.shutdown()


def export(module, path: str | os.PathLike) -> Path:
    """Build a (partitioned) Relax module into a library that :func:`app` can serve: placed on the CPU
    and compiled with :func:`byoc_hetero.compile`, so that the library carries its input signature
    and declared ranges (what a replica checks requests against)."""
    from .placement import compile as compile_placed
    from .placement import place

    path = Path(path)
    compile_placed(place(module, {}, fallback="cpu")).export_library(str(path))
    return path


@dataclass
class Answer:
    """What :func:`post` got back: the HTTP status, the output (or the error text), the batch's rows."""

    status: int
    output: np.ndarray | None
    error: str = ""
    batch_rows: int = 0


def post(url: str, *inputs: np.ndarray, timeout: float = 60.0) -> Answer:
    """Send ``inputs`` to a served model (``.npy`` for one input, ``.npz`` for several) and read the
    answer; an HTTP error status comes back as ``Answer.status`` with its text, not as an exception."""
    import urllib.error
    import urllib.request

    buf = io.BytesIO()
    if len(inputs) == 1:
        np.save(buf, inputs[0], allow_pickle=False)
    else:
        np.savez(buf, *inputs)
    req = urllib.request.Request(url, data=buf.getvalue(), headers={"content-type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            rows = int(reply.headers.get("x-batch-rows", "0"))
            return Answer(reply.status, np.load(io.BytesIO(reply.read()), allow_pickle=False), "", rows)
    except urllib.error.HTTPError as err:
        text = err.read().decode(errors="replace")
        try:
            text = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            pass
        return Answer(err.code, None, text)
