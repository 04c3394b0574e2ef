"""The Open Inference Protocol (KServe v2) over HTTP, as Triton, OpenVINO Model Server and KServe speak it.

Routes (``{name}`` alone means the model's highest version; ``/versions/{v}`` picks one)::

    GET  /v2                                         server metadata (name, version, extensions)
    GET  /v2/health/live, /v2/health/ready           200 while the replica runs
    GET  /v2/models/{name}[/versions/{v}]            inputs and outputs: name, datatype, shape (-1: symbolic)
    GET  /v2/models/{name}[/versions/{v}]/ready       200 when the model is loaded
    POST /v2/models/{name}[/versions/{v}]/infer      JSON tensors, or the binary tensor extension

Binary tensors (what ``tritonclient.http`` sends by default): the body starts with a JSON header of
``Inference-Header-Content-Length`` bytes; an input whose ``parameters`` carry ``binary_data_size`` takes
that many bytes (little-endian, row-major) from what follows, in order. Outputs come back binary when the
request says ``binary_data_output`` (or ``binary_data`` per requested output), as JSON ``data`` otherwise.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ..inputs import TensorSpec
from .core import Call, Model, RequestError, RequestPath

DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
             "FP16": "float16", "FP32": "float32", "FP64": "float64"}
"""The protocol's tensor datatypes this server reads and writes, as numpy dtypes (BYTES and BF16 are not)."""

V2_DATATYPE = {v: k for k, v in DATATYPES.items()}
HEADER_LENGTH = "Inference-Header-Content-Length"


def tensor_metadata(spec: TensorSpec) -> dict[str, Any]:
    """A tensor's entry in model metadata: -1 for every dim that is not a fixed size."""
    shape = [-1] if spec.shape is None else [d if isinstance(d, int) else -1 for d in spec.shape]
    datatype = V2_DATATYPE.get(spec.dtype, spec.dtype.upper()) if spec.dtype else ""  # "": the model leaves it open
    return {"name": spec.name, "datatype": datatype, "shape": shape}


def model_metadata(path: RequestPath, model: Model) -> dict[str, Any]:
    """``GET /v2/models/{name}``: the model's versions, platform, inputs and outputs."""
    engine = model.engine
    return {"name": model.name, "versions": path.versions(model.name),
            "platform": "byoc_hetero" if model.spec.engine == "byoc" else "onnxruntime_onnx",
            "inputs": [tensor_metadata(s) for s in engine.specs if s is not None],
            "outputs": [tensor_metadata(s) for s in engine.outputs if s is not None]}


def _tensor(t: Any, binary: memoryview, offset: int) -> tuple[str, np.ndarray, int]:
    """One request input: its name, array and the binary offset after it."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise RequestError(400, f"request: an input must be an object with a name, got {str(t)[:80]}")
    name, datatype, shape = t["name"], t.get("datatype"), t.get("shape")
    if datatype not in DATATYPES:
        raise RequestError(400, f"input {name!r}: datatype {datatype!r} is not supported "
                                f"(supported: {', '.join(DATATYPES)})")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise RequestError(400, f"input {name!r}: shape must be a list of sizes >= 0, got {shape!r}")
    dtype, count = np.dtype(DATATYPES[datatype]), math.prod(shape)
    size = (t.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if size != count * dtype.itemsize:
            raise RequestError(400, f"input {name!r}: binary_data_size {size} is not {count} x {dtype.itemsize} "
                                    f"bytes of {datatype} {shape}")
        if offset + size > len(binary):
            raise RequestError(400, f"input {name!r}: {size} binary bytes announced, {len(binary) - offset} left")
        array = np.frombuffer(binary, dtype.newbyteorder("<"), count, offset).astype(dtype, copy=False)
        return name, array.reshape(shape), offset + size
    if "data" not in t:
        raise RequestError(400, f"input {name!r}: neither data nor parameters.binary_data_size")
    try:
        array = np.asarray(t["data"], dtype=dtype)
    except (ValueError, TypeError) as err:
        raise RequestError(400, f"input {name!r}: data is not {datatype}: {err}") from err
    if array.size != count:
        raise RequestError(400, f"input {name!r}: {array.size} values for shape {shape} ({count} values)")
    return name, array.reshape(shape), offset


def parse_infer(body: bytes, header_length: str | None, model: Model) -> tuple[dict[str, Any], list[np.ndarray]]:
    """An infer request's JSON document and its inputs in the model's order; RequestError (400) when the
    body does not parse or the inputs' names are not the model's."""
    split = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise RequestError(400, f"request: {HEADER_LENGTH} {header_length!r} is not a size within the "
                                    f"body's {len(body)} bytes")
        split = int(header_length)
    try:
        doc = json.loads(body[:split])
    except ValueError as err:
        raise RequestError(400, f"request: not a JSON inference request: {err}") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError(400, "request: not a JSON inference request of the form {\"inputs\": [...]}")
    binary, offset, arrays = memoryview(bytearray(body[split:])), 0, {}
    for t in doc["inputs"]:
        name, array, offset = _tensor(t, binary, offset)
        if name in arrays:
            raise RequestError(400, f"input {name!r} given twice")
        arrays[name] = array
    if offset != len(binary):
        raise RequestError(400, f"request: {len(binary) - offset} binary bytes that no input claims")
    names = [s.name if s is not None else f"input{i}" for i, s in enumerate(model.engine.specs)]
    if sorted(arrays) != sorted(names):
        raise RequestError(400, f"{model.engine.entry}: model {model.name!r} takes inputs {names}, got {list(arrays)}")
    _requested_outputs(doc, model)
    return doc, [arrays[n] for n in names]


def _output_names(model: Model, count: int | None = None) -> list[str]:
    names = [s.name if s is not None else f"output{i}" for i, s in enumerate(model.engine.outputs)]
    return names + [f"output{i}" for i in range(len(names), count or 0)]


def _requested_outputs(doc: dict[str, Any], model: Model, count: int | None = None) -> list[tuple[str, bool]]:
    """(name, binary) of each output to return: those the request names, else all."""
    binary_default = bool((doc.get("parameters") or {}).get("binary_data_output", False))
    known = _output_names(model, count)
    wanted = doc.get("outputs")
    if wanted is None:
        return [(name, binary_default) for name in known]
    if not isinstance(wanted, list) or not all(isinstance(w, dict) and isinstance(w.get("name"), str) for w in wanted):
        raise RequestError(400, "request: outputs must be a list of objects with a name")
    missing = [w["name"] for w in wanted if w["name"] not in known]
    if missing and (model.engine.outputs or count is not None):
        raise RequestError(400, f"model {model.name!r} has no output {missing[0]!r} (outputs: {known})")
    return [(w["name"], bool((w.get("parameters") or {}).get("binary_data", binary_default))) for w in wanted]


def format_infer(doc: dict[str, Any], model: Model, outputs: list[np.ndarray],
                 batch_rows: int) -> tuple[bytes, dict[str, str]]:
    """The answer's body and headers: a JSON document (its ``parameters.batch_rows``: the rows of the model
    call that computed it), then the binary outputs if any."""
    by_name = dict(zip(_output_names(model, len(outputs)), outputs))
    entries, blobs = [], []
    for name, binary in _requested_outputs(doc, model, len(outputs)):
        out = np.ascontiguousarray(by_name[name])
        entry = {"name": name, "datatype": V2_DATATYPE.get(str(out.dtype), str(out.dtype).upper()),
                 "shape": list(out.shape)}
        if binary:
            blob = out.astype(out.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = out.ravel().tolist()
        entries.append(entry)
    answer = {"model_name": model.name, "model_version": model.version, "outputs": entries,
              "parameters": {"batch_rows": batch_rows}}
    if "id" in doc:
        answer["id"] = doc["id"]
    head = json.dumps(answer).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def _route(parts: list[str]) -> tuple[str | None, str | None, str]:
    """``models/{name}[/versions/{v}][/action]`` as (name, version, action); action ``""`` is metadata."""
    if len(parts) < 2 or parts[0] != "models":
        return None, None, "/".join(parts)
    name, rest, version = parts[1], parts[2:], None
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = rest[1], rest[2:]
    return name, version, "/".join(rest)


async def handle(path: RequestPath, request, call: Call, server: dict[str, Any]):
    """Answer one ``/v2/...`` request (RequestError for what the client got wrong)."""
    from starlette.responses import JSONResponse, Response

    parts = [p for p in request.url.path.split("/") if p][1:]
    method = request.method
    if method == "GET" and not parts:
        return JSONResponse(server)
    if method == "GET" and parts in (["health", "live"], ["health", "ready"]):
        return JSONResponse({parts[1]: True})
    name, version, action = _route(parts)
    if name is not None and (method, action) in (("GET", ""), ("GET", "ready"), ("POST", "infer")):
        model = path.get(name, version)
        call.model, call.version = model.name, model.version
        if action == "":
            return JSONResponse(model_metadata(path, model))
        if action == "ready":
            return JSONResponse({"name": model.name, "version": model.version, "ready": True})
        doc, inputs = parse_infer(await path.read_body(request), request.headers.get(HEADER_LENGTH), model)
        outputs, n = await path.infer(model, inputs)
        body, headers = format_infer(doc, model, outputs, n)
        return Response(body, headers={**headers, "x-batch-rows": str(n)})
    raise RequestError(404, f"no endpoint {method} {request.url.path} in the v2 protocol")
