"""The deployment: the replica class, the application of a set of models, starting and stopping Serve.

A replica holds every model of the application behind one :class:`~byoc_hetero.serve.core.RequestPath`
and routes each HTTP request to a protocol module: ``/v2/...`` to :mod:`~byoc_hetero.serve.kserve`,
``/metrics`` to :mod:`~byoc_hetero.serve.metrics`, anything else to :mod:`~byoc_hetero.serve.legacy`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import serve

from ..errors import ByocError
from . import kserve, legacy, openai
from . import metrics as _metrics
from .core import Call as _Call
from .core import ModelSpec, RequestError, RequestPath, model_specs

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

MAX_REQUEST_BYTES = 64 << 20
"""Default bound on a request body (:func:`app`'s ``max_request_bytes``): a larger one is answered 413
before it is read whole."""

THREAD_ENV = ("BYOC_HETERO_NUM_THREADS", "OMP_NUM_THREADS", "TVM_NUM_THREADS", "MKL_NUM_THREADS")
"""Set to a replica's CPU budget in its environment: the runtime, libgomp and TVM's pool read them."""


@dataclass(frozen=True)
class ServeConfig:
    """What one deployment serves and how (see :func:`app`). ``path`` and ``engine`` name its first model;
    ``models`` holds every model as ``NAME:VERSION=PATH`` text (the first one included)."""

    path: str
    engine: str = "byoc"
    replicas: int = 1
    cpus: int = 1
    batch: bool = False
    max_batch_rows: int = 16
    batch_wait_s: float = 0.005
    entry: str = "main"
    models: tuple[str, ...] = ()
    max_request_bytes: int = MAX_REQUEST_BYTES
    llm_slots: int = 8

    def model_specs(self) -> list[ModelSpec]:
        """The specs of every model served (the first model alone when ``models`` is empty)."""
        return model_specs(list(self.models) or [self.path], None if self.models else self.engine)


class Replica:
    """One Ray Serve replica: its models behind one :class:`~byoc_hetero.serve.core.RequestPath`, and the
    protocols over it (``/v2/...``: KServe v2; ``/metrics``: Prometheus; anything else: the first one)."""

    def __init__(self, config: dict[str, Any], collector=None) -> None:
        self.config = ServeConfig(**{**config, "models": tuple(config.get("models", ()))})
        self.recorder = _metrics.Recorder(collector, _metrics.replica_id())
        self.path = RequestPath(self.config.model_specs(), cpus=self.config.cpus, entry=self.config.entry,
                                batch=self.config.batch, max_batch_rows=self.config.max_batch_rows,
                                batch_wait_s=self.config.batch_wait_s,
                                max_request_bytes=self.config.max_request_bytes, recorder=self.recorder,
                                llm_slots=self.config.llm_slots)
        self.engine = self.path.default.engine  # the first model's, as before several models

    def info(self) -> dict[str, Any]:
        from .. import _C

        return {"engine": self.path.default.spec.engine, "cpus": self.config.cpus,
                "runtime_threads": _C.num_threads(), "env": {k: os.environ.get(k) for k in THREAD_ENV},
                "pid": os.getpid(), "batch": self.config.batch, "replica": self.recorder.replica,
                "models": {name: sorted(versions) for name, versions in self.path.models.items()}}

    def check(self, inputs: list[np.ndarray]) -> None:
        """InputError unless ``inputs`` match the first model's signature (and, batching, fit one batch)."""
        self.path.check(self.path.default, inputs)

    async def predict(self, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
        """Inputs of the first model -> its outputs, and the rows of the call they ran in."""
        return await self.path.infer(self.path.default, inputs)

    async def __call__(self, request) -> Any:
        from starlette.responses import JSONResponse, PlainTextResponse

        url = request.url.path
        call = _Call("v2" if url.startswith("/v2") else "openai" if url.startswith("/v1/")
                     else "metrics" if url == "/metrics" else "legacy")
        began, status = _metrics.now(), 500
        try:
            if call.protocol == "v2":
                response = await kserve.handle(self.path, request, call, _server_metadata())
            elif call.protocol == "openai":
                response = await openai.handle(self.path, request, call, self.recorder)
            elif call.protocol == "metrics":
                response = PlainTextResponse(await self.recorder.text(),
                                             media_type="text/plain; version=0.0.4; charset=utf-8")
            else:
                response = await legacy.handle(self.path, request, call, self.info)
            status = response.status_code
            return response
        except RequestError as err:
            status = err.status
            return JSONResponse({"error": str(err)}, status_code=err.status)
        except Exception as err:  # noqa: BLE001 - a failed model call is this request's 500, not the replica's end
            return JSONResponse({"error": f"{type(err).__name__}: {err}"}, status_code=500)
        finally:
            if call.protocol != "metrics":
                self.recorder.request(call.model, call.version, call.protocol, status, _metrics.now() - began)


def _server_metadata() -> dict[str, Any]:
    from .. import __version__

    return {"name": "byoc-hetero", "version": __version__, "extensions": ["binary_tensor_data"]}


# -- deploying -------------------------------------------------------------------------------------

def _environment(cpus: int) -> dict[str, str]:
    """A replica's environment: thread counts from its CPU budget, and this byoc_hetero importable."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {**{k: str(cpus) for k in THREAD_ENV}, "PYTHONPATH": path}


def app(models, *, engine: str | None = None, replicas: int = 1, cpus: int = 1, batch: bool = False,
        max_batch_rows: int = 16, batch_wait_s: float = 0.005, name: str = "byoc_hetero",
        max_request_bytes: int = MAX_REQUEST_BYTES, llm_slots: int = 8) -> serve.Application:
    """A Ray Serve application serving ``models``: one library or ONNX file, ``NAME[:VERSION]=PATH`` text,
    a list of those, or a mapping of ``NAME[:VERSION]`` to path (a name defaults to the file's stem, a
    version to ``1``; ``engine``: ``"byoc"``, ``"onnxruntime"``, or None for ONNX Runtime on ``.onnx``
    files and byoc-hetero otherwise). ``replicas`` replicas of ``cpus`` CPUs each (the runtime's
    threads), each holding every model, optionally batching concurrent requests up to ``max_batch_rows``
    rows, waiting at most ``batch_wait_s`` for a batch; a request body over ``max_request_bytes`` is a
    413. A generator folder (``bh.llm``'s ``Generator.save``) is served by the OpenAI API at ``/v1/...``
    (:mod:`.openai`), its requests decoded ``llm_slots`` at a time by continuous batching. A second
    deployment, ``<name>_metrics``, keeps the replicas' Prometheus metrics."""
    if min(replicas, cpus, max_batch_rows, max_request_bytes, llm_slots) < 1:
        raise ByocError(f"replicas, cpus, max_batch_rows, max_request_bytes and llm_slots must be >= 1, got "
                        f"{replicas}, {cpus}, {max_batch_rows}, {max_request_bytes}, {llm_slots}")
    specs = model_specs(models, engine)
    _metrics.prometheus()  # installed (else a ByocError saying how to get it)
    config = ServeConfig(specs[0].path, specs[0].engine, replicas, cpus, batch, max_batch_rows, batch_wait_s,
                         models=tuple(f"{s.name}:{s.version}={s.path}" for s in specs),
                         max_request_bytes=max_request_bytes, llm_slots=llm_slots)
    collector = serve.deployment(_metrics.Collector, name=f"{name}_metrics", num_replicas=1,
                                 ray_actor_options={"num_cpus": 0}).bind()
    deployment = serve.deployment(Replica, name=name, num_replicas=replicas, max_ongoing_requests=4 * max_batch_rows,
                                  health_check_period_s=HEALTH_CHECK_PERIOD_S,
                                  ray_actor_options={"num_cpus": cpus,
                                                     "runtime_env": {"env_vars": _environment(cpus)}})
    return deployment.bind(asdict(config), collector)


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
    from ..placement import compile as compile_placed
    from ..placement import place

    path = Path(path)
    compile_placed(place(module, {}, fallback="cpu")).export_library(str(path))
    return path
