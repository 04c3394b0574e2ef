"""Prometheus metrics of a deployment, served at ``GET /metrics`` by any replica.

Each replica records what it did (:class:`Recorder`: requests with their protocol, model, version and
HTTP code; per model call its rows, compute time and each request's queue time) and sends the records, a
batch at a time, to one :class:`Collector` deployment of the same application, which keeps them in a
``prometheus_client`` registry with a ``replica`` label. ``GET /metrics`` flushes the answering replica's
records and returns the collector's text, so one scrape sees every replica (records of the others are at
most :data:`FLUSH_PERIOD_S` old). The names and labels are in :data:`METRICS` and docs/serving.md.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..errors import ByocError

FLUSH_PERIOD_S = 0.5
"""How often a replica sends its records to the collector (and at every ``GET /metrics`` it answers)."""

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "byoc_hetero_requests": ("counter", ("model", "version", "protocol", "code", "replica"),
                             "HTTP requests answered, by model, protocol (v2, legacy) and status code"),
    "byoc_hetero_request_failures": ("counter", ("model", "version", "protocol", "code", "replica"),
                                     "requests answered with a status code of 400 or more"),
    "byoc_hetero_request_seconds": ("histogram", ("model", "version", "protocol", "replica"),
                                    "time from a request's arrival at its replica to its answer"),
    "byoc_hetero_queue_seconds": ("histogram", ("model", "version", "replica"),
                                  "time a checked request waited (batcher, the replica's one worker) before "
                                  "the model call that ran it started"),
    "byoc_hetero_compute_seconds": ("histogram", ("model", "version", "replica"),
                                    "time of one model call (once per call, however many requests it ran)"),
    "byoc_hetero_batch_rows": ("histogram", ("model", "version", "replica"), "rows of one model call"),
}
"""Every metric of the tensor protocols: its kind, label names and help text (counters are exported with a
``_total`` suffix)."""

LLM_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "byoc_hetero_llm_requests": ("counter", ("model", "version", "endpoint", "finish_reason", "replica"),
                                 "generation requests (OpenAI API) that ran, by endpoint (completions, chat) and "
                                 "finish reason (stop, length, error, cancelled)"),
    "byoc_hetero_llm_prompt_tokens": ("counter", ("model", "version", "replica"), "prompt tokens prefilled"),
    "byoc_hetero_llm_generated_tokens": ("counter", ("model", "version", "replica"), "tokens generated"),
    "byoc_hetero_llm_time_to_first_token_seconds": ("histogram", ("model", "version", "replica"),
                                                    "time from a request's arrival to its first token"),
    "byoc_hetero_llm_time_per_output_token_seconds": ("histogram", ("model", "version", "replica"),
                                                      "time between two consecutive tokens of a request"),
    "byoc_hetero_llm_decode_sequences": ("histogram", ("model", "version", "replica"),
                                         "sequences of one decode step of the continuous batcher"),
}
"""The metrics of generator models (the OpenAI API, :mod:`.openai`), as :data:`METRICS`; exported once a
generator model has answered."""

ALL_METRICS = {**METRICS, **LLM_METRICS}


def prometheus():
    """The prometheus_client module; ByocError saying how to install it when missing."""
    try:
        import prometheus_client
    except ImportError as err:
        raise ByocError("metrics need prometheus-client: pip install \"byoc-hetero[serve]\"") from err
    return prometheus_client


class Collector:
    """The deployment that keeps every replica's records (one replica, no CPU of its own)."""

    def __init__(self) -> None:
        prom = prometheus()
        prom.disable_created_metrics()  # no *_created series: counters and histograms only
        self._registry = prom.CollectorRegistry()
        self._metrics: dict[str, Any] = {}
        for name, (kind, labels, text) in ALL_METRICS.items():
            if kind == "counter":
                self._metrics[name] = prom.Counter(name, text, labels, registry=self._registry)
            else:
                buckets = ROWS_BUCKETS if name.endswith(("rows", "sequences")) else LATENCY_BUCKETS
                self._metrics[name] = prom.Histogram(name, text, labels, registry=self._registry, buckets=buckets)

    def record(self, replica: str, records: list[tuple[str, tuple[str, ...], float]]) -> None:
        """Add ``records``: (metric name, label values without the replica, value) each."""
        for name, labels, value in records:
            metric = self._metrics[name].labels(*labels, replica)
            if ALL_METRICS[name][0] == "counter":
                metric.inc(value)
            else:
                metric.observe(value)

    def text(self) -> str:
        """The Prometheus text exposition of everything recorded."""
        return prometheus().generate_latest(self._registry).decode()


class Recorder:
    """A replica's side: collects records and sends them to the collector's handle in batches."""

    def __init__(self, handle, replica: str) -> None:
        self._handle, self.replica = handle, replica
        self._pending: list[tuple[str, tuple[str, ...], float]] = []
        self._task: asyncio.Task | None = None

    def request(self, model: str, version: str, protocol: str, code: int, seconds: float) -> None:
        """One answered request."""
        self._add(("byoc_hetero_requests", (model, version, protocol, str(code)), 1.0))
        if code >= 400:
            self._add(("byoc_hetero_request_failures", (model, version, protocol, str(code)), 1.0))
        self._add(("byoc_hetero_request_seconds", (model, version, protocol), seconds))

    def call(self, model: str, version: str, rows: int, compute_s: float, queue_s: list[float]) -> None:
        """One model call: its rows and time, and the queue time of each request it ran."""
        self._add(("byoc_hetero_batch_rows", (model, version), float(rows)))
        self._add(("byoc_hetero_compute_seconds", (model, version), compute_s))
        for q in queue_s:
            self._add(("byoc_hetero_queue_seconds", (model, version), q))

    def llm(self, model: str, version: str, endpoint: str, finish: str, prompt_tokens: int,
            first_token_s: list[float], token_gaps_s: list[float], decode_steps: list[int]) -> None:
        """One generation request: its finish reason, prompt tokens, time to its first token (none if it
        made none), the times between its tokens (one per token after the first), and the sizes of the
        scheduler's decode steps since the last record."""
        labels = (model, version)
        self._add(("byoc_hetero_llm_requests", (*labels, endpoint, finish), 1.0))
        self._add(("byoc_hetero_llm_prompt_tokens", labels, float(prompt_tokens)))
        self._add(("byoc_hetero_llm_generated_tokens", labels, float(len(first_token_s) + len(token_gaps_s))))
        for name, values in (("byoc_hetero_llm_time_to_first_token_seconds", first_token_s),
                             ("byoc_hetero_llm_time_per_output_token_seconds", token_gaps_s),
                             ("byoc_hetero_llm_decode_sequences", decode_steps)):
            for value in values:
                self._add((name, labels, float(value)))

    def _add(self, record) -> None:
        self._pending.append(record)
        if self._task is None and self._handle is not None:
            try:
                self._task = asyncio.get_running_loop().create_task(self._flush_soon())
            except RuntimeError:  # no loop in this thread: the next record from the loop starts it
                pass

    async def _flush_soon(self) -> None:
        try:
            await asyncio.sleep(FLUSH_PERIOD_S)
            await self.flush()
        finally:
            self._task = None

    async def flush(self) -> None:
        """Send what is pending (a no-op without a collector)."""
        records, self._pending = self._pending, []
        if records and self._handle is not None:
            await self._handle.record.remote(self.replica, records)

    async def text(self) -> str:
        """Every replica's metrics, this replica's records included."""
        await self.flush()
        if self._handle is None:
            raise ByocError("no metrics collector in this deployment")
        return await self._handle.text.remote()


def replica_id() -> str:
    """This replica's id in Serve (its process id outside Serve)."""
    import os

    try:
        from ray import serve

        context = serve.get_replica_context()
        return str(getattr(getattr(context, "replica_id", None), "unique_id", None) or context.replica_tag)
    except Exception:  # noqa: BLE001 - outside a replica any failure means: no Serve context
        return f"pid{os.getpid()}"


def now() -> float:
    """The clock of every duration recorded."""
    return time.perf_counter()
