"""The one request path every protocol goes through: models by name and version, body limits, input
checks, the batcher, the model call, metrics.

A protocol module (``legacy``, ``kserve``) only turns HTTP into ``(model, inputs)`` and outputs back into
HTTP; :meth:`RequestPath.infer` does the rest. Errors a client caused are :class:`RequestError` (an
:class:`~byoc_hetero.errors.InputError` with an HTTP status: 400, 404, 413); they are raised before the
model is called, so no bad request reaches a model, spoils a batch or crashes a replica.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ByocError, InputError, ModelFileError
from ..inputs import check
from ..llm.generator import MANIFEST
from . import metrics as _metrics
from .engines import engine_for, open_engine


class RequestError(InputError):
    """A request the server refuses, with its HTTP status (400 bad input, 404 no such model or version,
    413 too large)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class ModelSpec:
    """One served model file: its name, version, path and engine (``"byoc"`` or ``"onnxruntime"``)."""

    name: str
    version: str
    path: str
    engine: str


def model_spec(text: str | Path, engine: str | None = None) -> ModelSpec:
    """``NAME[:VERSION]=PATH`` or a bare ``PATH`` (name: the file's stem, version ``1``) as a spec; the
    engine is ``engine`` or, when None or ``"auto"``, ONNX Runtime for ``.onnx`` and byoc-hetero otherwise."""
    text = str(text)
    name, sep, path = text.partition("=")
    if not sep:
        name, path = Path(text).stem, text
    name, _, version = name.partition(":")
    version = version or "1"
    for what, value in (("name", name), ("version", version)):
        if not _NAME.match(value):
            raise InputError(f"model {what} {value!r} in {text!r}: use letters, digits, '_', '.' and '-'")
    if Path(path).is_dir() and not (Path(path) / MANIFEST).is_file():
        raise ModelFileError(f"{path} is a folder without {MANIFEST} (a bh.llm Generator.save folder)")
    if not Path(path).exists():
        raise ModelFileError(f"no such file: {path}")
    return ModelSpec(name, version, str(Path(path).resolve()), engine_for(path, engine))


def model_specs(models, engine: str | None = None) -> list[ModelSpec]:
    """Specs of ``models``: a path, ``NAME[:VERSION]=PATH`` text, a list of those, or a mapping of
    ``NAME[:VERSION]`` to path. Two files with one name and version are an error."""
    if isinstance(models, Mapping):
        items = [f"{key}={path}" for key, path in models.items()]
    elif isinstance(models, str | Path):
        items = [models]
    else:
        items = list(models)
    if not items:
        raise InputError("no model to serve")
    specs = [model_spec(item, engine) for item in items]
    seen: dict[tuple[str, str], str] = {}
    for s in specs:
        if (s.name, s.version) in seen:
            raise InputError(f"model {s.name} version {s.version} given twice: {seen[s.name, s.version]} and {s.path}")
        seen[s.name, s.version] = s.path
    return specs


def _version_key(version: str) -> tuple:
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


@dataclass
class Model:
    """A loaded model version: its spec and engine."""

    spec: ModelSpec
    engine: object

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version


@dataclass
class Call:
    """What one HTTP request was, for its metrics: the protocol and, once known, the model and version."""

    protocol: str
    model: str = ""
    version: str = ""


@dataclass
class _Item:
    model: Model
    inputs: list[np.ndarray]
    enqueued: float = field(default_factory=_metrics.now)


def run_batch(run: Callable, items: list[list[np.ndarray]],
              on_call: Callable[[list[int], int, float, float], None] | None = None) -> list[tuple[list[np.ndarray], int]]:
    """Run requests as batches: those whose inputs agree on every dim but the first (and dtypes) are
    concatenated along axis 0, run in one call, and each output is split back by rows. Returns, per
    request, its outputs and the rows of the call it ran in. ``on_call(members, rows, started, seconds)``
    hears of each call."""
    groups: dict[tuple, list[int]] = {}
    for i, inputs in enumerate(items):
        groups.setdefault(tuple((x.shape[1:], str(x.dtype)) for x in inputs), []).append(i)
    answers: list[tuple[list[np.ndarray], int]] = [([], 0) for _ in items]
    for members in groups.values():
        rows = [int(items[i][0].shape[0]) for i in members]
        stacked = [np.concatenate([items[i][k] for i in members]) for k in range(len(items[members[0]]))]
        started = _metrics.now()
        outputs = run(stacked)
        if on_call is not None:
            on_call(members, sum(rows), started, _metrics.now() - started)
        for out in outputs:
            if out.ndim == 0 or out.shape[0] != sum(rows):
                raise ByocError(f"batched output of shape {list(out.shape)} has no batch dim of {sum(rows)} "
                                "rows: serve this model with batch=False")
        for i, part in zip(members, zip(*(np.split(o, np.cumsum(rows)[:-1]) for o in outputs))):
            answers[i] = (list(part), sum(rows))
    return answers


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` inflated from ``encoding`` (identity, gzip, deflate), at most ``limit`` bytes."""
    import zlib

    windows = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in windows:
        raise RequestError(400, f"request: Content-Encoding {encoding!r} is not supported (gzip, deflate, identity)")
    inflater = zlib.decompressobj(windows[encoding])
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as err:
        raise RequestError(400, f"request: body is not valid {encoding}: {err}") from err
    if len(out) > limit:
        raise RequestError(413, f"request: body inflates to more than max_request_bytes={limit} bytes")
    return out


def rows(inputs: list[np.ndarray]) -> int:
    """The rows (first dim) of a request's first input; 1 for a scalar or no input."""
    return int(inputs[0].shape[0]) if inputs and inputs[0].ndim else 1


class RequestPath:
    """Models by name and version, their checks, the batcher and the one worker thread of a replica."""

    def __init__(self, specs: list[ModelSpec], *, cpus: int, entry: str, batch: bool, max_batch_rows: int,
                 batch_wait_s: float, max_request_bytes: int, recorder: _metrics.Recorder, llm_slots: int = 8) -> None:
        self.models: dict[str, dict[str, Model]] = {}
        for s in specs:
            engine = open_engine(s.path, s.engine, cpus, entry, llm_slots)
            self.models.setdefault(s.name, {})[s.version] = Model(s, engine)
        self.default = self.get(specs[0].name, specs[0].version)
        self.batch, self.max_batch_rows, self.max_request_bytes = batch, max_batch_rows, max_request_bytes
        self.recorder = recorder
        self._pool = ThreadPoolExecutor(1)  # one call at a time per replica; the event loop stays free
        self._batched = _batcher(self._run, max_batch_rows, batch_wait_s) if batch else None

    def get(self, name: str, version: str | None = None) -> Model:
        """The model ``name`` at ``version`` (its highest version when None); 404 if there is none."""
        versions = self.models.get(name)
        if versions is None:
            raise RequestError(404, f"no model {name!r} here (models: {', '.join(sorted(self.models))})")
        if version is None:
            return versions[max(versions, key=_version_key)]
        if version not in versions:
            raise RequestError(404, f"model {name!r} has no version {version!r} (versions: "
                                    f"{', '.join(sorted(versions, key=_version_key))})")
        return versions[version]

    def versions(self, name: str) -> list[str]:
        """The versions of model ``name``, lowest first."""
        self.get(name)
        return sorted(self.models[name], key=_version_key)

    async def read_body(self, request) -> bytes:
        """The request's body, inflated if its Content-Encoding is gzip or deflate; 413 past
        ``max_request_bytes`` (by its Content-Length, as it streams, or inflated)."""
        limit = self.max_request_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"request: body of {int(declared)} bytes, more than max_request_bytes={limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"request: body of more than max_request_bytes={limit} bytes")
            chunks.append(chunk)
        return _decompress(b"".join(chunks), request.headers.get("content-encoding", "identity"), limit)

    def check(self, model: Model, inputs: list[np.ndarray]) -> None:
        """InputError unless ``inputs`` match ``model``'s signature (and, batching, fit one batch)."""
        engine = model.engine
        if model.spec.engine == "llm":
            raise InputError(f"model {model.name!r} is a generator: POST /v1/completions or /v1/chat/completions")
        check(engine.entry, engine.specs, inputs, engine.ranges)
        if self.batch and inputs and inputs[0].ndim and inputs[0].shape[0] > self.max_batch_rows:
            raise InputError(f"{engine.entry}: {inputs[0].shape[0]} rows in one request, more than "
                             f"max_batch_rows={self.max_batch_rows}")

    async def infer(self, model: Model, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
        """Checked inputs -> ``model``'s outputs, and the rows of the call they ran in (through the batcher
        when batching). A 400 (RequestError) when the inputs do not match the model."""
        try:
            self.check(model, inputs)
        except InputError as err:
            raise RequestError(400, str(err)) from err
        item = _Item(model, inputs)
        if self._batched is not None:
            answer = await self._batched(item)
        else:
            answer = (await self._run([item]))[0]
        if isinstance(answer, Exception):  # its model's call failed (other models' requests were answered)
            raise answer
        return answer

    async def _run(self, items: list[_Item]) -> list[tuple[list[np.ndarray], int]]:
        """Run ``items`` in the worker thread, one batch per model, and record each call."""
        loop = asyncio.get_running_loop()
        answers, calls = await loop.run_in_executor(self._pool, _run_items, items)
        for model, n, started, seconds, enqueued in calls:
            self.recorder.call(model.name, model.version, n, seconds, [started - e for e in enqueued])
        return answers


def _run_items(items: list[_Item]):
    """Worker thread: group ``items`` by model, run each model's group with :func:`run_batch`; returns the
    answers in order (the exception, for the requests of a model whose call failed) and the calls made
    (model, rows, start, seconds, the members' enqueue times)."""
    by_model: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        by_model.setdefault(id(item.model), []).append(i)
    answers: list = [None] * len(items)
    calls = []
    for members in by_model.values():
        model = items[members[0]].model

        def on_call(group, n, started, seconds, members=members, model=model):
            calls.append((model, n, started, seconds, [items[members[g]].enqueued for g in group]))

        try:
            group = run_batch(model.engine.run, [items[i].inputs for i in members], on_call)
        except Exception as err:  # noqa: BLE001 - this model's requests fail; the others' answers stand
            group = [err] * len(members)
        for i, answer in zip(members, group):
            answers[i] = answer
    return answers, calls


def _batcher(run, max_batch_rows: int, batch_wait_s: float):
    """``run`` (items -> answers) behind Ray Serve's ``@serve.batch``: concurrent requests of any model
    wait at most ``batch_wait_s`` and make calls of at most ``max_batch_rows`` rows."""
    from ray import serve

    @serve.batch(max_batch_size=max_batch_rows, batch_wait_timeout_s=batch_wait_s,
                 batch_size_fn=lambda items: sum(rows(i.inputs) for i in items))
    async def batched(items: list[_Item]) -> list[tuple[list[np.ndarray], int]]:
        return await run(items)

    return batched
