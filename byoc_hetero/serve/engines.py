"""Engines: load one model file in a replica, say what it takes and gives, run it.

An engine has ``entry`` (the function served), ``specs`` (the inputs' :class:`~byoc_hetero.inputs.TensorSpec`),
``outputs`` (the outputs' specs; empty when the file does not say), ``ranges`` (declared ranges of symbolic
dims) and ``run(inputs) -> outputs``. Three kinds: an exported byoc-hetero library (``"byoc"``), an ONNX
file on ONNX Runtime's CPU provider (``"onnxruntime"``, the benchmark's reference) and a generator folder
(``"llm"``: ``bh.llm``'s ``Generator.save``, answered through the OpenAI API of :mod:`.openai`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ByocError, InputError
from ..inputs import TensorSpec
from ..llm import load
from .scheduler import SLOTS, Scheduler

ENGINES = ("byoc", "onnxruntime", "llm")


def engine_for(path: str | Path, engine: str | None) -> str:
    """The engine that serves ``path``: ``engine`` when given, else ONNX Runtime for ``.onnx`` files and
    byoc-hetero for everything else; a generator folder (``bh.llm``'s ``Generator.save``) is ``"llm"``."""
    if Path(path).is_dir():
        return "llm"
    if engine is None or engine == "auto":
        return "onnxruntime" if str(path).endswith(".onnx") else "byoc"
    if engine not in ENGINES:
        raise ByocError(f"engine must be one of {list(ENGINES)} or 'auto', got {engine!r}")
    return engine


class ByocEngine:
    """An exported byoc-hetero library (its placement plan carries the input and output signature and
    the declared dim ranges)."""

    def __init__(self, path: str, cpus: int, entry: str = "main") -> None:
        import tvm

        from .. import _C
        from ..placement import vm

        _C.set_num_threads(cpus)  # for the modules loaded next (the environment says the same)
        try:
            self._vm = vm(tvm.runtime.load_module(path))
        except ByocError as err:
            raise ByocError(f"{path}: {err}; export it with byoc_hetero.serve.export(module, path)") from err
        self.entry = entry
        self.specs = self._vm.input_specs(entry)
        self.outputs = self._vm.output_specs(entry)
        self.ranges = self._vm.dim_ranges(entry)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        out = self._vm[self.entry](*inputs)
        return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


_ORT_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64",
               "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(float16)": "float16",
               "tensor(uint8)": "uint8", "tensor(int8)": "int8"}


def _ort_spec(arg: Any) -> TensorSpec:
    return TensorSpec(arg.name, _ORT_DTYPES.get(arg.type),
                      tuple(d if isinstance(d, int | str) else None for d in arg.shape))


class OrtEngine:
    """An ONNX file on ONNX Runtime's CPU provider, checked with the same signature rules."""

    def __init__(self, path: str, cpus: int, entry: str = "main") -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = cpus, 1
        self._sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self._names = [i.name for i in self._sess.get_inputs()]
        self.entry, self.ranges = entry, {}
        self.specs = [_ort_spec(i) for i in self._sess.get_inputs()]
        self.outputs = [_ort_spec(o) for o in self._sess.get_outputs()]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(self._sess.run(None, dict(zip(self._names, inputs))))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class LlmEngine:
    """A generator folder in a replica: the generator, its tokenizer (None without one) and its scheduler."""

    def __init__(self, path: str, cpus: int, entry: str = "main", slots: int = SLOTS) -> None:
        from .. import _C

        _C.set_num_threads(cpus)
        self.generator = load(path)
        self.tokenizer = _tokenizer(Path(path))
        self.scheduler = Scheduler(self.generator, slots, Path(path).name)
        self.entry, self.specs, self.outputs, self.ranges = "generate", [], [], {}

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise InputError("a generator model answers /v1/completions and /v1/chat/completions, not tensors")


def _tokenizer(folder: Path):
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def open_engine(path: str, engine: str | None, cpus: int, entry: str = "main", llm_slots: int = 8) -> Any:
    """The model at ``path`` loaded in this process on ``engine`` (see :func:`engine_for`) with ``cpus``
    threads; a generator folder with its continuous batcher of ``llm_slots`` sequences."""
    kind = engine_for(path, engine)
    if kind == "llm":
        return LlmEngine(path, cpus, entry, llm_slots)
    return {"byoc": ByocEngine, "onnxruntime": OrtEngine}[kind](path, cpus, entry)


def load_engine(config) -> ByocEngine | OrtEngine:
    """The engine of ``config`` (a :class:`~byoc_hetero.serve.ServeConfig`: its ``path``, ``engine``,
    ``cpus`` and ``entry``), loaded in this process."""
    return open_engine(config.path, config.engine, config.cpus, config.entry)
