"""Serving exported libraries on Ray Serve (``pip install "byoc-hetero[serve]"``).

One process or machine is not enough any more: put the models behind Ray Serve. Each replica is a Ray
actor with a CPU budget (``cpus``); the runtime's threads are set from it before the libraries load
(``BYOC_HETERO_NUM_THREADS``, ``OMP_NUM_THREADS`` and ``TVM_NUM_THREADS`` in the replica's environment,
and :func:`byoc_hetero._C.set_num_threads`), so replicas on one machine do not oversubscribe it. A
replica holds every model of the application (``app({"cnn": "cnn.so", "cnn:2": "cnn2.so"})``, or
``byoc-hetero serve --model cnn=cnn.so ...``), each a name and a version.

Protocols are thin layers over one request path (:mod:`.core`: model lookup, body limit, input checks,
batcher, model call, metrics):

- :mod:`.kserve`: the Open Inference Protocol (KServe v2) at ``/v2/...``, JSON and binary tensors, what
  ``tritonclient.http`` and KServe's clients speak;
- :mod:`.legacy`: ``POST /`` with ``.npy``/``.npz``/JSON bodies to the first model, ``GET /info``;
- :mod:`.openai`: the OpenAI API at ``/v1/...`` for generator folders (``bh.llm``), requests decoded
  together step by step by a :class:`~byoc_hetero.serve.scheduler.Scheduler` (continuous batching);
- :mod:`.metrics`: Prometheus text at ``/metrics``, every replica's counts.

With ``batch=True`` the replica groups concurrent requests with Ray Serve's ``@serve.batch``: the rows
of requests for one model with the same trailing shape are concatenated along axis 0, run in one call of
a symbolic-batch build (one library serves every batch size) and split again. The batch is bounded in
*rows* (``max_batch_rows``), which must fit the batch dim's declared range.

Bad requests never reach a model: an unknown model or version is HTTP 404, a body that does not parse or
inputs whose names, count, datatype or shape do not match the signature are 400 with the
:class:`~byoc_hetero.errors.InputError` text, a body over ``max_request_bytes`` is 413.

Failures are bounded: Serve's proxy answers HTTP 408 to a request it has no answer for within
``request_timeout_s`` (:func:`start`, 30 s by default; Ray's own default is no bound), and the controller
health-checks replicas every :data:`HEALTH_CHECK_PERIOD_S`, replacing a dead one at the first failed check.
Requests a dying replica had accepted fail with HTTP 500; none is answered wrongly.

A library must carry its signature: build it with :func:`export` (or ``bh.compile`` of a placed module).
An ``.onnx`` file is served by ONNX Runtime (the benchmark's reference, with ``intra_op_num_threads`` from
the same budget).
"""

from __future__ import annotations

from ..errors import ByocError

try:
    import ray  # noqa: F401
    from ray import serve as _serve  # noqa: F401
except ImportError as _err:  # the extra is optional
    raise ByocError("byoc_hetero.serve needs Ray Serve: pip install \"byoc-hetero[serve]\" "
                    "(or \"ray[serve]\")") from _err

from .core import ModelSpec, RequestError, RequestPath, model_spec, model_specs, run_batch
from .deploy import (HEALTH_CHECK_PERIOD_S, MAX_REQUEST_BYTES, PROXY_READY_CHECK_TIMEOUT_S, REQUEST_TIMEOUT_S,
                     THREAD_ENV, Replica, ServeConfig, app, export, shutdown, start)
from .engines import load_engine, open_engine
from .legacy import Answer, decode, encode, post
from .metrics import LLM_METRICS, METRICS

__all__ = ["HEALTH_CHECK_PERIOD_S", "LLM_METRICS", "MAX_REQUEST_BYTES", "METRICS", "PROXY_READY_CHECK_TIMEOUT_S",
           "REQUEST_TIMEOUT_S", "THREAD_ENV", "Answer", "ModelSpec", "Replica", "RequestError", "RequestPath",
           "ServeConfig", "app", "decode", "encode", "export", "load_engine", "model_spec", "model_specs",
           "open_engine", "post", "run_batch", "shutdown", "start"]
