"""The first protocol (kept for compatibility): ``POST /`` to the deployment's first model, ``GET /info``.

Requests: a ``.npy`` body (one input; the answer is ``.npy``), an ``.npz`` body (several inputs in order;
the answer is ``.npy`` of the first output), or JSON ``{"inputs": [nested lists], "dtypes": [...]}``
(dtypes default to the signature's; the answer is ``{"outputs": [...], "shape": ..., "dtype": ...}``).
The answer's header ``x-batch-rows`` says how many rows the call that computed it had.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..inputs import TensorSpec
from .core import Call, RequestError, RequestPath


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


async def handle(path: RequestPath, request, call: Call, info: Callable[[], dict[str, Any]]):
    """``GET /`` or ``/info``: ``info()``; ``POST /``: run the first model."""
    from starlette.responses import JSONResponse, Response

    if request.method == "GET":
        return JSONResponse(info())
    model = path.default
    call.model, call.version = model.name, model.version
    body = await path.read_body(request)
    try:
        inputs, kind = decode(body, request.headers.get("content-type", ""), model.engine.specs)
    except InputError as err:
        raise RequestError(400, str(err)) from err
    outputs, n = await path.infer(model, inputs)
    body, content_type = encode(outputs, kind)
    return Response(body, media_type=content_type, headers={"x-batch-rows": str(n)})


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
