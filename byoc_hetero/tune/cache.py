"""A timing cache on disk, in the manner of TensorRT's: measured times keyed by what was measured.

A tuner times many candidates (an op's implementation variants, a region's precisions, a region on
each device, a copy of a tensor between two devices). The same candidate recurs within a model (a
ResNet's repeated blocks) and across models, so each timing is stored under a *signature*: the op
and its input shapes, dtypes and attributes plus the candidate's choice (see :func:`signature`).

A timing is only as good as the machine it was taken on. The file therefore records a
:class:`MachineKey` — CPU model and flags, the runtime library's version and ISA, TVM's and this package's
versions, the GPU — and is used only where the key equals the current machine's:

- a *foreign* file (another CPU, ISA or GPU) is ignored with a :class:`TimingCacheWarning`;
- a *stale* file (same machine, other library versions) is ignored with a warning too: a new runtime
  library may pick other kernels, so its old timings would steer decisions wrongly;
- a corrupt file (not JSON, wrong format name or version, malformed entries) is ignored with a
  warning.

Beside timings, the file keeps measured output errors (``errors``: the precision level's, keyed by
model, plan and inputs, :mod:`.plan_errors`). Ignored files are never trusted in part. :meth:`TimingCache.save` replaces the file atomically (a
temporary file renamed over it), so a tuner killed while saving leaves the old file intact. A file
can be shipped with a model and replayed on the same kind of machine for the same decisions.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import platform
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

FORMAT = "byoc-hetero-timing-cache"
VERSION = 1


class TimingCacheWarning(UserWarning):
    """A timing cache file was ignored (foreign machine, stale library versions, or corrupt)."""


@dataclass(frozen=True)
class MachineKey:
    """What a timing depends on besides the candidate itself."""

    cpu: str
    cpu_flags: str  # a digest of the CPU flags: a KVM guest may hide AVX-512 on the same model name
    isa: str  # the runtime library's effective ISA
    onednn: str
    tvm: str
    byoc_hetero: str
    gpu: str = ""
    # A digest of the runtime extension's binary: kernels change between builds of one version
    # (session 5: a cache written before a kernel fix kept a 220 ms mix that now runs in 13 ms),
    # and a wheel's users share one binary, so a shipped cache still replays for them.
    runtime: str = ""
    # A digest of this package's Python sources: the cache also keeps what a partition looked like
    # (the int8 choice's node maps, the region documents units are timed on: :mod:`.node_maps`),
    # which the passes decide; a change to them between two releases' version numbers must make
    # those entries stale, not replayed onto another partition.
    sources: str = ""

    def machine_part(self) -> tuple[str, str, str, str]:
        """The fields that name the hardware (differing: a *foreign* cache)."""
        return (self.cpu, self.cpu_flags, self.isa, self.gpu)

    @classmethod
    def current(cls, gpu: str = "") -> "MachineKey":
        """The key of this process's machine and libraries."""
        import tvm

        from .._native import _C

        cpu, flags = platform.processor() or platform.machine(), ""
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    if line.startswith("model name") and cpu in ("", platform.processor()):
                        cpu = line.split(":", 1)[1].strip()
                    elif line.startswith("flags") and not flags:
                        flags = " ".join(sorted(line.split(":", 1)[1].split()))
        except OSError:
            pass
        digest = hashlib.sha256(flags.encode()).hexdigest()[:16]
        return cls(cpu=cpu, cpu_flags=digest, isa=_C.isa(), onednn=_C.onednn_version(),
                   tvm=str(tvm.__version__), byoc_hetero=str(_C.__version__), gpu=gpu,
                   runtime=_runtime_digest(getattr(_C, "__file__", None)), sources=_sources_digest())


@functools.lru_cache(maxsize=None)
def _runtime_digest(path: str | None) -> str:
    """The first 16 hex digits of the extension file's SHA-256 ("" when it cannot be read)."""
    if not path:
        return ""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return ""
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _sources_digest() -> str:
    """The first 16 hex digits of a SHA-256 over this package's ``.py`` files (paths and bytes)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = sorted(os.path.relpath(os.path.join(folder, name), root) for folder, _, files in os.walk(root)
                   for name in files if name.endswith(".py"))
    h = hashlib.sha256()
    for path in paths:
        h.update(path.encode() + b"\0")
        with open(os.path.join(root, path), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Timing:
    """One measurement: the median of ``samples`` timed calls, and their spread (IQR / median)."""

    median_s: float
    samples: int
    spread: float = 0.0

    @classmethod
    def from_json(cls, obj: Mapping) -> "Timing":
        t = cls(float(obj["median_s"]), int(obj["samples"]), float(obj.get("spread", 0.0)))
        if not (t.median_s >= 0.0 and t.samples >= 1 and t.spread >= 0.0):
            raise ValueError(f"bad timing {dict(obj)}")
        return t


def signature(kind: str, shapes: Iterable[Iterable[int]] = (), dtypes: Iterable[str] = (),
              attrs: Mapping | None = None, choice: str = "") -> str:
    """The cache key of one candidate: ``kind`` (an op or ``"region"``/``"copy"``), the input
    shapes and dtypes, attributes (any JSON-serializable mapping, keys sorted) and the choice
    (e.g. ``"winograd"``, ``"bf16"``, ``"cuda:0"``). Equal candidates give equal keys whatever
    model they came from."""
    body = {"kind": kind, "shapes": [[int(d) for d in s] for s in shapes],
            "dtypes": [str(d) for d in dtypes], "attrs": dict(attrs or {}), "choice": choice}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


def _error_from_json(value: object) -> float:
    """A stored error: a number >= 0 (``Infinity`` for a plan whose output was not finite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"bad error {value!r}")
    return float(value)


class TimingCache:
    """Timings on disk (``path``; None keeps them in memory only) for one :class:`MachineKey`."""

    def __init__(self, path: str | os.PathLike | None = None, machine: MachineKey | None = None):
        self.path = os.fspath(path) if path is not None else None
        self.machine = machine if machine is not None else MachineKey.current()
        self.entries: dict[str, Timing] = {}
        self.errors: dict[str, float] = {}  # measured output errors (the precision level's), by signature
        self.values: dict[str, Any] = {}  # other measured values, JSON (the int8 choice's activation ranges)
        self.hits = 0
        self.misses = 0
        self.ignored: str | None = None  # why a file on disk was not used
        self.dirty = False  # anything stored since the file was read or written
        if self.path is not None and os.path.exists(self.path):
            self._load()

    def _ignore(self, why: str) -> None:
        self.ignored = why
        self.dirty = True  # the file on disk is not this cache: the next save replaces it
        warnings.warn(f"timing cache {self.path} ignored: {why}", TimingCacheWarning, stacklevel=3)

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            return self._ignore(f"not a readable JSON file ({type(err).__name__}: {err})")
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return self._ignore(f"not a {FORMAT} file")
        if doc.get("version") != VERSION:
            return self._ignore(f"format version {doc.get('version')!r}, this reader takes {VERSION}")
        try:
            theirs = MachineKey(**doc["machine"])
            entries = {str(k): Timing.from_json(v) for k, v in doc["entries"].items()}
            errors = {str(k): _error_from_json(v) for k, v in doc.get("errors", {}).items()}
            values = dict(doc.get("values", {}))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            return self._ignore(f"malformed ({type(err).__name__}: {err})")
        if theirs.machine_part() != self.machine.machine_part():
            return self._ignore(f"foreign: measured on {theirs.cpu} / {theirs.isa} / gpu "
                                f"{theirs.gpu or 'none'}, this is {self.machine.cpu} / "
                                f"{self.machine.isa} / gpu {self.machine.gpu or 'none'}")
        if theirs != self.machine:
            return self._ignore(f"stale: libraries onednn {theirs.onednn}, tvm {theirs.tvm}, "
                                f"byoc_hetero {theirs.byoc_hetero} (runtime build "
                                f"{theirs.runtime or 'unknown'}, sources {theirs.sources or 'unknown'}); now "
                                f"onednn {self.machine.onednn}, tvm {self.machine.tvm}, byoc_hetero "
                                f"{self.machine.byoc_hetero} (runtime build {self.machine.runtime or 'unknown'}, "
                                f"sources {self.machine.sources or 'unknown'})")
        self.entries, self.errors, self.values = entries, errors, values

    def get(self, key: str) -> Timing | None:
        """The stored timing of ``key`` (counted as a hit), or None (a miss)."""
        return self._counted(self.entries.get(key))

    def _counted(self, found: Any) -> Any:
        """``found``, counted as a hit, or as a miss when None."""
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, key: str, timing: Timing) -> None:
        self.entries[key] = timing
        self.dirty = True

    def get_error(self, key: str) -> float | None:
        """The stored output error of ``key`` (a hit), or None (a miss)."""
        return self._counted(self.errors.get(key))

    def put_error(self, key: str, error: float) -> None:
        self.errors[key] = float(error)
        self.dirty = True

    def get_value(self, key: str) -> Any:
        """The stored value of ``key`` (a hit), or None (a miss)."""
        return self._counted(self.values.get(key))

    def put_value(self, key: str, value: Any) -> None:
        """Store a JSON-serializable ``value``."""
        self.values[key] = value
        self.dirty = True

    def __len__(self) -> int:
        return len(self.entries)

    def save(self) -> None:
        """Write the cache to ``path`` atomically (nothing to do without a path, or when nothing was
        stored since the file was read: a warm tune of ResNet-50 rewrote its 0.6 MB file 4 times)."""
        if self.path is None or (not self.dirty and os.path.exists(self.path)):
            return
        doc = {"format": FORMAT, "version": VERSION, "machine": asdict(self.machine),
               "entries": {k: asdict(v) for k, v in sorted(self.entries.items())},
               "errors": dict(sorted(self.errors.items())), "values": dict(sorted(self.values.items()))}
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".timing-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, self.path)
            self.dirty = False
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


_ACTIVE: contextvars.ContextVar[TimingCache | None] = contextvars.ContextVar("byoc_hetero_timing_cache", default=None)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("byoc_hetero_tune_deadline", default=None)


@contextlib.contextmanager
def active(cache: TimingCache, deadline: float | None = None) -> Iterator[TimingCache]:
    """Within the ``with``, :func:`active_cache` is ``cache`` and :func:`active_deadline` ``deadline`` (a
    ``time.monotonic()`` value, None for none): ``bh.tune`` makes its timing cache the active one while its
    levels run, and its ``budget_s`` the deadline a backend's own search stops at."""
    token, deadline_token = _ACTIVE.set(cache), _DEADLINE.set(deadline)
    try:
        yield cache
    finally:
        _DEADLINE.reset(deadline_token)
        _ACTIVE.reset(token)


def active_deadline() -> float | None:
    """When the ``bh.tune`` running in this context runs out of its ``budget_s`` (``time.monotonic()``), None
    outside one or without a budget: a backend's own search (the tvm_cpu backend's MetaSchedule) spends no time
    past it."""
    return _DEADLINE.get()


def active_cache() -> TimingCache | None:
    """The timing cache of the ``bh.tune`` running in this context, None outside one: where a backend keeps
    what a search of its own found (``put_value``), beside the timings, for the build that applies the
    tune's decisions (the tvm_cpu backend's MetaSchedule records)."""
    return _ACTIVE.get()
