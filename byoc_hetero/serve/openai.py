"""The OpenAI API for generator models (``bh.llm`` folders saved by ``Generator.save``), on the same deployment.

Routes::

    GET  /v1/models                   the generator models served (OpenAI's model list)
    GET  /v1/models/{name}            one of them (404 if none)
    POST /v1/completions              a prompt (text, or an array of token ids) -> its continuation
    POST /v1/chat/completions         messages -> the assistant's answer (a tokenizer is needed)

``"stream": true`` answers server-sent events: ``data: {chunk}`` per new piece, then ``data: [DONE]``.
Requests run on the model's :class:`~byoc_hetero.serve.scheduler.Scheduler` (continuous batching).

A folder with a Hugging Face tokenizer saved next to the generator (``tokenizer.json`` /
``tokenizer_config.json``, what ``tokenizer.save_pretrained(folder)`` writes) takes and gives text; chat
uses the tokenizer's chat template, or :data:`PLAIN_TEMPLATE` when it has none. Without a tokenizer the
completions API takes the array-of-token-ids prompt and answers ids (``choices[].token_ids``, ``text``
empty); chat is a 400. Every choice carries its ``token_ids`` (an extension), and a non-streamed answer
``batch_sequences_max``: the most sequences a decode step of the request ran with.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from ..llm import Sampler
from . import metrics as _metrics
from .core import Call, Model, RequestError, RequestPath
from .engines import LlmEngine
from .scheduler import Event, Sequence

PLAIN_TEMPLATE = "{role}: {content}\n"
"""The chat template of a tokenizer without one: each message as ``role: content`` and a newline, then
``assistant:`` for the answer."""

DEFAULT_MAX_TOKENS = 16
"""``max_tokens`` of a completion that gives none (OpenAI's default); a chat answer's default is the
room left in the cache."""

UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
               "suffix": (None, ""), "tools": (None, []), "response_format": (None,)}
"""Request fields this server does not implement, with the values that mean "not used" (others: a 400)."""


# ---- requests ------------------------------------------------------------------------------------

@dataclass
class Job:
    """One parsed request: the prompt's ids, how to generate, how to answer."""

    chat: bool
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    stop_ids: frozenset[int]
    stop_text: tuple[str, ...]
    stream: bool
    include_usage: bool
    fields: dict[str, Any] = field(default_factory=dict)


def _field(doc: dict, name: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    value = doc.get(name, default)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
        raise RequestError(400, f"request: {name} must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}")
    return value


def _token_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return list(value)
    return None


def _prompt(doc: dict, engine: LlmEngine) -> list[int]:
    """The completions prompt as ids: text (with a tokenizer) or an array of token ids, one prompt."""
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    ids = _token_list(prompt)
    if ids is not None:
        return ids
    if isinstance(prompt, str) and prompt:
        if engine.tokenizer is None:
            raise RequestError(400, "request: this model has no tokenizer (none saved in its folder): give the "
                                    "prompt as an array of token ids")
        return list(engine.tokenizer(prompt)["input_ids"])
    raise RequestError(400, "request: prompt must be a non-empty string or array of token ids (one prompt; "
                            f"several prompts in one request are not supported), got {str(prompt)[:80]!r}")


def _messages(doc: dict, engine: LlmEngine) -> list[int]:
    """The chat messages as ids, through the tokenizer's chat template (or :data:`PLAIN_TEMPLATE`)."""
    if engine.tokenizer is None:
        raise RequestError(400, "request: chat needs a tokenizer and this model has none (none saved in its "
                                "folder): use /v1/completions with a prompt of token ids")
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "request: messages must be a non-empty list of {role, content}")
    plain = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise RequestError(400, f"request: a message must be {{role: str, content: str}}, got {str(m)[:80]}")
        plain.append({"role": m["role"], "content": content})
    tok = engine.tokenizer
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    text = "".join(PLAIN_TEMPLATE.format(**m) for m in plain) + "assistant:"
    return list(tok(text)["input_ids"])


def _stops(doc: dict, engine: LlmEngine) -> tuple[frozenset[int], tuple[str, ...]]:
    stop = doc.get("stop")
    items = [] if stop is None else [stop] if isinstance(stop, str | int) else stop
    extra = doc.get("stop_token_ids") or []
    if not isinstance(items, list) or not isinstance(extra, list):
        raise RequestError(400, f"request: stop must be a string or a list of strings / token ids, got {stop!r}")
    ids = [s for s in items + extra if isinstance(s, int) and not isinstance(s, bool)]
    texts = tuple(s for s in items if isinstance(s, str) and s)
    if len(ids) + len(texts) != len(items) + len(extra):
        raise RequestError(400, f"request: stop must hold non-empty strings or token ids, got {stop!r}")
    if texts and engine.tokenizer is None:
        raise RequestError(400, "request: stop strings need a tokenizer and this model has none: give stop "
                                "token ids (stop_token_ids)")
    eos = getattr(engine.tokenizer, "eos_token_id", None)
    return frozenset(ids + ([eos] if isinstance(eos, int) else [])), texts


def _sampler(doc: dict) -> Sampler:
    temperature = _field(doc, "temperature", (int, float), 1.0)
    top_p = _field(doc, "top_p", (int, float), 1.0)
    seed = _field(doc, "seed", (int,))
    try:
        if temperature == 0:
            return Sampler()  # greedy
        return Sampler(True, float(temperature), 0, float(top_p), seed)
    except InputError as err:
        raise RequestError(400, f"request: {err}") from err


def parse(doc: Any, engine: LlmEngine, chat: bool) -> Job:
    """A request's JSON document as a :class:`Job`; RequestError (400) for what is missing or wrong."""
    for name, unused in UNSUPPORTED.items():
        if name in doc and doc[name] not in unused:
            raise RequestError(400, f"request: {name}={doc[name]!r} is not supported by this server")
    n = _field(doc, "n", (int,), 1)
    if n != 1:
        raise RequestError(400, f"request: n={n}: one choice per request (n=1) is supported")
    prompt = _messages(doc, engine) if chat else _prompt(doc, engine)
    max_tokens = _field(doc, "max_completion_tokens" if chat and "max_completion_tokens" in doc else "max_tokens",
                        (int,))
    if max_tokens is None:
        # chat: the room left (at least 1, so that a prompt that fills the cache is told so)
        max_tokens = max(engine.generator.max_length - len(prompt), 1) if chat else DEFAULT_MAX_TOKENS
    stream = bool(_field(doc, "stream", (bool,), False))
    options = _field(doc, "stream_options", (dict,)) or {}
    stop_ids, stop_text = _stops(doc, engine)
    return Job(chat, prompt, max_tokens, _sampler(doc), stop_ids, stop_text, stream,
               bool(options.get("include_usage")))


# ---- running a job ---------------------------------------------------------------------------------

class Text:
    """The answer's text as tokens come: decoded whole each time, stop strings cut, what is safe to send
    (not the tail that might still become a stop string, nor an incomplete character) told apart."""

    def __init__(self, tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.text, self.sent, self.stopped = "", 0, False

    def add(self, token: int) -> None:
        self.ids.append(token)
        if self.tokenizer is None:
            return
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            text, self.stopped = text[:min(cuts)], True
        self.text = text

    def pending(self, final: bool) -> str:
        """The text not sent yet that can be sent now (all of it when ``final``)."""
        end = len(self.text)
        if not final:
            end -= max((len(s) - 1 for s in self.stops), default=0)
            while end > self.sent and self.text[end - 1] == "\ufffd":
                end -= 1
        piece = self.text[self.sent:end] if end > self.sent else ""
        self.sent += len(piece)
        return piece


class Run:
    """One job on its model's scheduler, its events in an asyncio queue, its timings for the metrics."""

    def __init__(self, model: Model, job: Job, began: float) -> None:
        self.model, self.job, self.began = model, job, began
        self.engine: LlmEngine = model.engine
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.text = Text(self.engine.tokenizer, job.stop_text)
        self.times: list[float] = []
        self.batch_max = 0
        self.finish: str | None = None
        loop = asyncio.get_running_loop()
        self.seq = Sequence(np.asarray(job.prompt), job.max_tokens, job.sampler, job.stop_ids,
                            lambda e: loop.call_soon_threadsafe(self.events.put_nowait, e))
        try:
            self.engine.scheduler.submit(self.seq)
        except InputError as err:
            raise RequestError(400, str(err)) from err

    async def next(self) -> Event:
        """The next event; its token added to the text (a stop string ends the run)."""
        event = await self.events.get()
        if event.error is not None:
            self.finish = "error"
            raise RuntimeError(event.error)
        self.times.append(_metrics.now())
        self.batch_max = max(self.batch_max, event.batch)
        self.text.add(event.token)
        self.finish = "stop" if self.text.stopped else event.finish
        if self.text.stopped and event.finish is None:
            self.engine.scheduler.cancel(self.seq)
        return event

    def cancel(self) -> None:
        self.engine.scheduler.cancel(self.seq)

    def usage(self) -> dict[str, int]:
        p, c = len(self.job.prompt), len(self.text.ids)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def record(self, recorder: _metrics.Recorder) -> None:
        """This run's LLM metrics (and the scheduler's decode steps since the last record)."""
        m, v = self.model.name, self.model.version
        recorder.llm(m, v, "chat" if self.job.chat else "completions", self.finish or "cancelled",
                     len(self.job.prompt), [self.times[0] - self.began] if self.times else [],
                     list(np.diff(self.times)), self.engine.scheduler.take_steps())


def _choice(run: Run, piece: str, tokens: list[int], finish: str | None) -> dict[str, Any]:
    if run.job.chat:
        return {"index": 0, "message": {"role": "assistant", "content": piece}, "finish_reason": finish,
                "token_ids": tokens}
    return {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish, "token_ids": tokens}


def _head(run: Run, rid: str, chunk: bool) -> dict[str, Any]:
    kind = ("chat.completion" if run.job.chat else "text_completion") + (".chunk" if chunk and run.job.chat else "")
    return {"id": rid, "object": kind, "created": int(time.time()), "model": run.model.name}


async def complete(run: Run) -> dict[str, Any]:
    """The whole answer of a non-streamed request."""
    while run.finish is None:
        await run.next()
    return {**_head(run, _id(run), False), "choices": [_choice(run, run.text.pending(True), run.text.ids, run.finish)],
            "usage": run.usage(), "batch_sequences_max": run.batch_max}


async def chunks(run: Run):
    """The server-sent events of a streamed request: a chunk per token that adds text (or, without a
    tokenizer, per token), the last one with the finish reason, the usage if asked, ``[DONE]``."""
    rid, first, sent = _id(run), True, 0
    try:
        while run.finish is None:
            try:
                await run.next()
            except RuntimeError as err:
                yield _sse({"error": {"message": str(err), "type": "server_error", "code": 500}})
                break
            piece = run.text.pending(run.finish is not None)
            if not piece and run.finish is None and run.engine.tokenizer is not None:
                continue
            tokens, sent = run.text.ids[sent:], len(run.text.ids)
            choice = _choice(run, piece, tokens, run.finish)
            if run.job.chat:
                choice["delta"] = {**({"role": "assistant"} if first else {}), "content": piece}
                del choice["message"]
            first = False
            yield _sse({**_head(run, rid, True), "choices": [choice]})
        if run.job.include_usage:
            yield _sse({**_head(run, rid, True), "choices": [], "usage": run.usage()})
        yield "data: [DONE]\n\n"
    finally:
        run.cancel()  # a client gone mid-stream frees its slot


def _sse(doc: dict[str, Any]) -> str:
    return f"data: {json.dumps(doc)}\n\n"


def _id(run: Run) -> str:
    return ("chatcmpl-" if run.job.chat else "cmpl-") + uuid.uuid4().hex[:24]


# ---- HTTP ----------------------------------------------------------------------------------------------

def generators(path: RequestPath) -> dict[str, Model]:
    """The generator models of a replica, by name (each at its highest version)."""
    return {name: path.get(name) for name in path.models if isinstance(path.get(name).engine, LlmEngine)}


def _model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "byoc-hetero"}


def _generator(path: RequestPath, name: Any) -> Model:
    if not isinstance(name, str):
        raise RequestError(400, f"request: model must be a string naming a served model, got {name!r}")
    found = generators(path).get(name)
    if found is None:
        raise RequestError(404, f"no generator model {name!r} here (generator models: "
                                f"{', '.join(sorted(generators(path))) or 'none'})")
    return found


async def handle(path: RequestPath, request, call: Call, recorder: _metrics.Recorder):
    """Answer one ``/v1/...`` request; errors in OpenAI's form ``{"error": {"message", "type", "code"}}``."""
    from starlette.responses import JSONResponse

    try:
        return await _handle(path, request, call, recorder)
    except RequestError as err:
        kind = "not_found_error" if err.status == 404 else "invalid_request_error"
        return JSONResponse({"error": {"message": str(err), "type": kind, "code": err.status}},
                            status_code=err.status)


async def _handle(path: RequestPath, request, call: Call, recorder: _metrics.Recorder):
    from starlette.responses import JSONResponse, StreamingResponse

    parts = [p for p in request.url.path.split("/") if p][1:]
    if request.method == "GET" and parts == ["models"]:
        return JSONResponse({"object": "list", "data": [_model_entry(n) for n in generators(path)]})
    if request.method == "GET" and len(parts) == 2 and parts[0] == "models":
        return JSONResponse(_model_entry(_generator(path, parts[1]).name))
    if request.method != "POST" or parts not in (["completions"], ["chat", "completions"]):
        raise RequestError(404, f"no endpoint {request.method} {request.url.path} in the OpenAI API here")
    began = _metrics.now()
    try:
        doc = json.loads(await path.read_body(request))
    except ValueError as err:
        raise RequestError(400, f"request: the body is not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise RequestError(400, "request: the body must be a JSON object")
    model = _generator(path, doc.get("model"))
    call.model, call.version = model.name, model.version
    run = Run(model, parse(doc, model.engine, parts[0] == "chat"), began)
    if run.job.stream:
        async def events():
            try:
                async for piece in chunks(run):
                    yield piece
            finally:
                run.record(recorder)

        return StreamingResponse(events(), media_type="text/event-stream")
    try:
        return JSONResponse(await complete(run))
    finally:
        run.cancel()
        run.record(recorder)
