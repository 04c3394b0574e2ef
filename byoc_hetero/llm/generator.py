"""The generator: a built decoder step, its KV caches and the token loop.

One :class:`Generator` holds the built step function (``model.step_module``, partitioned and built
for llvm + oneDNN regions). ``generate`` / ``stream`` allocate one cache per layer and K / V for
the batch, ``[batch, kv_heads, max_length, head_dim]`` float32, once per call; every step passes
the same cache tensors and the kernel appends to them in place (no copy of a cache per token).
A step is one call of the VM function: the prefill with all prompt rows (prompts of different
lengths padded on the right, ``lengths`` telling the kernel which rows are real), then one call per
new token with ``S`` = 1.

The oneDNN regions' constants (the weights) are not linked into the library: it holds placeholders,
and the generator gives the regions the constants itself (:func:`build_generator`), so that a saved
generator keeps them in ``weights.bin``, which :func:`load` maps instead of deserializing a copy that
TVM's const loader would keep beside the regions' prepared layouts (:mod:`.weights_file`, issue 36).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .._relax import region_modules
from ..errors import InputError
from .model import DecoderSpec
from .sampling import Sampler
from .weights_file import FILE as WEIGHTS_FILE
from .weights_file import Entry, MappedWeights, return_code_pages, spill_weights, write_weights

FORMAT = "byoc_hetero.llm"
VERSION = 2
"""The manifest's version: 2 keeps the oneDNN regions' constants in `weights.bin` (mapped by :func:`load`), 1
kept them inside the library (still read)."""
READABLE = (1, 2)
LIBRARY = "model.so"
MANIFEST = "generator.json"


def _stop_ids(stop: int | Iterable[int] | None) -> set[int]:
    if stop is None:
        return set()
    if isinstance(stop, (int, np.integer)):
        return {int(stop)}
    return {int(s) for s in stop}


def return_freed_heap(collect: bool = True) -> None:
    """Hand the heap a build freed (the step module's weights as Relax constants, the partition's
    copies, a file's dequantized weights: about the weights' size again) back to the system: glibc
    keeps freed heap mapped otherwise, and the process's resident size with it. :func:`build_generator`
    (every builder of a :class:`Generator`: ``from_hf``, ``from_onnx``, ``from_gguf``) calls it after
    ``relax.build``, and a generator before and after the first call of each step shape
    (``collect=False``: the heap only, no garbage collection), which hands back what the caller freed
    since (a transformers model dropped after ``from_hf``: torch's freed tensors under glibc's mmap
    threshold stay in its heap otherwise, SmolLM-135M: 101 MiB, bench/GENERATE.md session 15) and what
    the init program freed.
    A caller that frees much later (a model dropped after generating) may call it itself.
    ``collect``: run Python's garbage collector first (objects in reference cycles). Not glibc: nothing
    to do but the collection."""
    import gc

    if collect:
        gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another C library); looked up once."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


EXTERNAL_KIND = "byoc_hetero"
"""The runtime modules whose constants a generator keeps out of its library: the oneDNN regions' (their
``__init_`` takes placeholders first, docs/region-format.md "Calling convention")."""


def _viewable(tensor: Any) -> bool:
    """Whether numpy knows the tensor's dtype (a weights file stores it so)."""
    try:
        np.dtype(str(tensor.dtype))
    except TypeError:
        return False
    return True


def external_constants(part: tvm.IRModule) -> tuple[tvm.IRModule, dict[str, Any]]:
    """(``part`` with the constants of its oneDNN regions replaced by placeholders in
    ``const_name_to_constant``, those constants by name): what ``relax.build`` then links into the
    library's const loader has no elements (the library carries no weights), and the generator hands
    the constants to the regions itself (:func:`give_constants`; ``weights_file``'s docstring: why).
    A region with a constant of a dtype numpy does not know keeps its constants in the library."""
    attrs = dict(part.attrs) if part.attrs else {}
    table = {str(n): t for n, t in dict(attrs.get("const_name_to_constant", {})).items()}
    names: set[str] = set()
    for module in attrs.get("external_mods", []):
        if str(module.kind) == EXTERNAL_KIND:
            mine = [str(n) for n in module["get_const_vars"]()]
            if all(n in table and _viewable(table[n]) for n in mine):
                names.update(mine)
    if not names:
        return part, {}
    constants = {n: t for n, t in table.items() if n in names}
    for name, tensor in constants.items():
        table[name] = tvm.runtime.empty((0,), str(tensor.dtype), tvm.cpu())
    return part.with_attr("const_name_to_constant", table), constants


def give_constants(executable: Any, constants: dict[str, Any]) -> None:
    """Call ``__init_<symbol>`` of every oneDNN region of ``executable`` whose constants are among
    ``constants`` (name -> tensor) with them: the regions check their digests and keep references (no
    copy). A region given only some of its constants: ValueError naming the first missing."""
    for module in region_modules(executable):
        if str(module.kind) != EXTERNAL_KIND:
            continue
        names = [str(n) for n in module["get_const_vars"]()]
        given = [n for n in names if n in constants]
        if not given:
            continue
        symbol = str(module["get_symbol"]())
        if len(given) != len(names):
            missing = next(n for n in names if n not in constants)
            raise ValueError(f"region {symbol}: no tensor {missing!r} among the {len(constants)} given "
                             f"(the region has {len(names)} constants)")
        module["__init_" + symbol]([constants[n] for n in names])


def build_generator(part: tvm.IRModule, spec: DecoderSpec, max_length: int, weights: str,
                    weight_error: float | None = None, sources: Any = None) -> Generator:
    """The :class:`Generator` of a partitioned step module: built for llvm with its oneDNN regions'
    constants external (:func:`external_constants`), the build's freed heap and the resident pages of
    TVM's compiler code it ran handed back (:func:`~.weights_file.return_code_pages`).

    The constants are then written to a temporary weights file and the regions get them mapped from it
    (:func:`~.weights_file.spill_weights`): the generator holds no array of the build (nor the model's
    tensors ``sources`` names, which it then no longer watches), and its weights are resident once, as
    a loaded generator's (issue 36). Where the file cannot be written it keeps the arrays (and watches
    ``sources``, :meth:`Generator.check_sources`). A caller holding ``part`` should drop it and call
    :func:`return_freed_heap` after (the arrays it holds are freed then)."""
    part, constants = external_constants(part)
    executable = relax.build(part, target="llvm")
    del part
    mapped = spill_weights(constants)
    if mapped is not None:
        # the digests checked on the arrays (resident already; the file's pages are not read until the first
        # call's init program); the mapped tensors then replace them (a later __init_ is not compared)
        give_constants(executable, constants)
        constants, sources = mapped.tensors, None
    return_freed_heap()
    gen = Generator(executable, spec, int(max_length), weights, weight_error=weight_error, sources=sources,
                    constants=constants, weights_file=mapped)
    return_code_pages()  # TVM's compiler ran for the build (and the VM's creation), the calls do not run it
    return gen


class StepInputs:
    """The step function's four small inputs (``input_ids`` [batch, rows], ``past``, ``lengths``,
    ``last`` [batch], int64) as TVM tensors made once, with numpy views of their memory (DLPack, no
    copy): a caller writes the views (:meth:`set`) and passes the same tensors call after call, so a
    decode token converts nothing."""

    def __init__(self, batch: int, rows: int):
        self.shape = (int(batch), int(rows))
        shapes = (self.shape, (batch,), (batch,), (batch,))
        self.tensors = tuple(tvm.runtime.empty(shape, "int64", tvm.cpu()) for shape in shapes)
        self.tokens, self.past, self.lengths, self.last = (np.from_dlpack(t) for t in self.tensors)

    def set(self, tokens: np.ndarray | None, past: np.ndarray, lengths: np.ndarray) -> None:
        """Write ``tokens`` [batch, rows] (None: as they are), ``past`` and ``lengths`` [batch], and
        ``last``: each sequence's last real row, ``b * rows + max(lengths[b], 1) - 1``. An array of
        another shape is an InputError (numpy would broadcast a single value to every sequence)."""
        batch, rows = self.shape
        given = (("input_ids", tokens, self.shape), ("past", past, (batch,)), ("lengths", lengths, (batch,)))
        for name, value, want in given:
            if value is not None and np.shape(value) != want:
                raise InputError(f"step: {name} must have shape {list(want)} (batch {batch}, {rows} new rows), "
                                 f"got {list(np.shape(value))}")
        if tokens is not None:
            self.tokens[:] = tokens
        self.past[:] = past
        self.lengths[:] = lengths
        self.last[:] = np.arange(batch, dtype="int64") * rows + np.maximum(self.lengths, 1) - 1


class Generator:
    """Token generation with a decoder built by :func:`byoc_hetero.llm.from_hf` (or loaded by
    :func:`byoc_hetero.llm.load`).

    >>> gen = bh.llm.from_hf(model, max_length=64)
    >>> out = gen.generate(np.array([[1, 2, 3]]), max_new_tokens=8)   # int64 [1, 3 + 8]
    """

    def __init__(self, executable: Any, spec: DecoderSpec, max_length: int, weights: str = "f32",
                 weight_error: float | None = None, sources: Any = None, constants: dict[str, Any] | None = None,
                 weights_file: MappedWeights | None = None):
        """``sources``: the torch module whose parameters the constants share (``from_hf``): a call
        after an in-place change of one of them raises InputError (:meth:`check_sources`).
        ``constants``: the oneDNN regions' constants by name where the library holds placeholders
        (:func:`external_constants`), given to the regions here; ``weights_file``: the mapping they lie
        in (:func:`load`), whose pages are handed back once the regions prepared their layouts."""
        self._executable = executable
        named = sources.named_parameters() if sources is not None else ()
        # weak: a quantized generator holds codes of its own, and a strong reference would keep the model's
        # float32 weights resident after the caller drops the model; a parameter nobody holds cannot change
        self._sources = [(name, weakref.ref(p), p._version) for name, p in named]
        self.spec = spec
        self.max_length = int(max_length)
        self.weights = weights
        self.weight_error = weight_error
        """int8 / int4 weights: the quantization's largest relative layer error (``WeightOnlyModel.error``,
        max |x W_q - x W| / max |x W| on random rows); None for float weights."""
        self._constants = dict(constants or {})
        self._weights_file = weights_file
        self._library_file: Any = None  # load(): the library file, held open (save copies its bytes)
        self._shapes_run: set[tuple[int, ...]] = set()  # step shapes run since the mapping's pages went back
        give_constants(executable, self._constants)
        if weights_file is not None:
            weights_file.release()  # the digests read every page
        self._vm = relax.VirtualMachine(executable, tvm.cpu())
        self._main = self._vm["main"]

    # ---- inputs ---------------------------------------------------------------------------------
    def check_sources(self) -> None:
        """InputError if a parameter of the model this generator was built from (and shares its
        weights with) changed in place since the build (torch's version counter of the tensor; a
        change through ``.data`` or numpy is not counted)."""
        for name, ref, version in self._sources:
            tensor = ref()
            if tensor is not None and tensor._version != version:
                raise InputError(f"the model's parameter {name!r} changed after bh.llm.from_hf built this generator: "
                                 "the generator's constants are the model's own tensors (no copy), and layouts it "
                                 "prepared before the change hold the old values; build again, or build from a copy "
                                 "(copy.deepcopy(model)) to keep changing the model")

    def _prompts(self, input_ids: Any) -> tuple[list[np.ndarray], bool]:
        """(one int64 row per sequence, whether the input was rectangular), checked."""
        if hasattr(input_ids, "detach"):  # a torch tensor
            input_ids = input_ids.detach().cpu().numpy()
        rectangular = isinstance(input_ids, np.ndarray)
        if rectangular:
            if input_ids.ndim == 1:
                input_ids = input_ids[None]
            if input_ids.ndim != 2:
                raise InputError(f"input_ids must be [batch, length] (or a list of sequences), got shape "
                                 f"{list(input_ids.shape)}")
        rows = [np.asarray(r) for r in input_ids]
        if not rows:
            raise InputError("input_ids holds no sequence")
        for b, row in enumerate(rows):
            if row.ndim != 1 or row.size == 0 or not np.issubdtype(row.dtype, np.integer):
                raise InputError(f"input_ids sequence {b} must be a non-empty list of integer token ids, got "
                                 f"shape {list(row.shape)} dtype {row.dtype}")
            bad = row[(row < 0) | (row >= self.spec.vocab)]
            if bad.size:
                raise InputError(f"input_ids sequence {b} has token id {int(bad[0])}, outside the vocabulary "
                                 f"[0, {self.spec.vocab})")
        return [r.astype("int64") for r in rows], rectangular

    def _check_room(self, prompts: list[np.ndarray], max_new_tokens: int) -> None:
        if int(max_new_tokens) != max_new_tokens or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens}")
        for b, row in enumerate(prompts):
            if row.size + max_new_tokens > self.max_length:
                what = "the prompt" if row.size > self.max_length else f"the prompt + max_new_tokens {max_new_tokens}"
                raise InputError(f"input_ids sequence {b}: {what} ({row.size + max_new_tokens} tokens with a "
                                 f"prompt of {row.size}) is longer than the cache's max_length {self.max_length}")

    # ---- the step -------------------------------------------------------------------------------
    def new_cache(self, batch: int) -> list[Any]:
        """Fresh KV caches for ``batch`` sequences: per layer K then V, [batch, kv_heads, max_length,
        head_dim] float32 (what :meth:`step` takes and writes in place)."""
        shape = (batch, self.spec.kv_heads, self.max_length, self.spec.head_dim)
        cache = [tvm.runtime.empty(shape, "float32", tvm.cpu()) for _ in range(2 * self.spec.layers)]
        for c in cache:
            np.from_dlpack(c).fill(0.0)  # in place: no numpy array made and copied
        return cache

    def slot_cache(self, cache: list[Any], slot: int) -> list[Any]:
        """Views of sequence ``slot`` of ``cache`` (from :meth:`new_cache`): per layer K then V,
        [1, kv_heads, max_length, head_dim], sharing the cache's memory. A :meth:`step` with them (a
        prefill of one sequence, say) writes that sequence's rows only and leaves the others as they
        were (the continuous batching of ``byoc_hetero.serve``: a request joins a running batch)."""
        self._check_cache(cache, int(cache[0].shape[0]) if cache else 0)
        batch = int(cache[0].shape[0])
        if int(slot) != slot or not 0 <= slot < batch:
            raise InputError(f"slot {slot!r} is not a sequence of this cache of {batch}")
        shape = (1, self.spec.kv_heads, self.max_length, self.spec.head_dim)
        size = 4 * self.spec.kv_heads * self.max_length * self.spec.head_dim  # float32 bytes of one sequence
        return [c._create_view(shape, relative_byte_offset=int(slot) * size) for c in cache]

    def _check_cache(self, cache: list[Any], batch: int) -> None:
        want = (batch, self.spec.kv_heads, self.max_length, self.spec.head_dim)
        if len(cache) != 2 * self.spec.layers:
            raise InputError(f"the cache holds {len(cache)} tensors; this model's has {2 * self.spec.layers} "
                             f"(K and V of {self.spec.layers} layers)")
        for i, c in enumerate(cache):
            if tuple(c.shape) != want or str(c.dtype) != "float32":
                raise InputError(f"cache tensor {i} is {str(c.dtype)} {list(c.shape)}; this model's are float32 "
                                 f"{list(want)} (batch, kv_heads, max_length, head_dim): a cache of another model or "
                                 "batch")

    def step(self, tokens: np.ndarray, past: np.ndarray, lengths: np.ndarray, cache: list[Any]) -> np.ndarray:
        """One call of the decoder step: ``tokens`` [batch, S] int64 after ``past`` [batch] cached
        tokens, ``lengths`` [batch] of its rows real; appends them to ``cache`` in place and returns
        the logits of each sequence's last new row, float32 [batch, vocab]."""
        self._check_cache(cache, tokens.shape[0])
        self.check_sources()
        return self._call(tokens, past, lengths, cache)

    def _call(self, tokens: np.ndarray, past: np.ndarray, lengths: np.ndarray, cache: list[Any]) -> np.ndarray:
        """:meth:`step` without the cache check (a caller's own caches, checked once)."""
        inputs = StepInputs(*tokens.shape)
        inputs.set(tokens, past, lengths)
        return self._run(inputs, cache)

    def _run(self, inputs: StepInputs, cache: list[Any]) -> np.ndarray:
        """One call of the step function with ``inputs`` (their tensors as they are, no conversion):
        the logits [batch, vocab] as a numpy view of the tensor the call returned (DLPack, no copy;
        the view keeps the tensor alive, and each call returns a tensor of its own)."""
        new_shape = inputs.shape not in self._shapes_run
        if new_shape:
            return_freed_heap(collect=False)  # what the caller freed (a model dropped): not resident meanwhile
        out = self._main(*inputs.tensors, *cache)
        if new_shape:
            # a new shape made plans and prepared their layouts from the mapping: its pages go back (those
            # read in place come back as they are read), and the heap the init program freed; once per
            # shape, not per token
            self._shapes_run.add(inputs.shape)
            if self._weights_file is not None:
                self._weights_file.release()
            return_freed_heap(collect=False)
        return np.from_dlpack(out)

    # ---- generation -----------------------------------------------------------------------------
    def stream(self, input_ids: Any, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
               stop: int | Iterable[int] | None = None) -> Iterator[np.ndarray]:
        """Yield the next token of every sequence (int64 [batch]) as it comes, at most
        ``max_new_tokens`` times; a sequence that produced a token of ``stop`` repeats that token
        from then on, and the stream ends when every sequence has stopped. Arguments as
        :meth:`generate`'s."""
        sampler = Sampler(do_sample, temperature, top_k, top_p, seed)
        prompts, _ = self._prompts(input_ids)
        self._check_room(prompts, max_new_tokens)
        self.check_sources()
        yield from self._tokens(prompts, int(max_new_tokens), sampler, _stop_ids(stop))

    def _tokens(self, prompts: list[np.ndarray], max_new_tokens: int, sampler: Sampler,
                stop: set[int]) -> Iterator[np.ndarray]:
        """The new tokens, one int64 [batch] array a step: the prefill of every prompt (padded on the
        right), then decode steps of one row whose inputs are made once and written in place (a token
        costs the step function's call, the sampler and a few small numpy writes)."""
        if max_new_tokens == 0:
            return
        batch = len(prompts)
        lengths = np.array([p.size for p in prompts], dtype="int64")
        prefill = StepInputs(batch, int(lengths.max()))
        prefill.tokens[:] = 0
        for b, p in enumerate(prompts):
            prefill.tokens[b, :p.size] = p
        prefill.set(None, np.zeros(batch, dtype="int64"), lengths)
        cache, rng = self.new_cache(batch), sampler.rng()
        self._check_cache(cache, batch)
        stop_ids = np.array(sorted(stop), dtype="int64")
        done = np.zeros(batch, dtype=bool)
        logits = self._run(prefill, cache)
        decode = StepInputs(batch, 1)
        decode.set(None, lengths, np.ones(batch, dtype="int64"))  # decode.last: row b, its only one
        del prefill
        for n in range(max_new_tokens):
            nxt = sampler.choose(logits, rng)
            del logits  # the step's output tensor goes back to the VM's pool before the next call
            if n:
                nxt[done] = decode.tokens[done, 0]  # a stopped sequence repeats its stop token
            if stop_ids.size:
                done |= np.isin(nxt, stop_ids)
            yield nxt
            if done.all() or n + 1 == max_new_tokens:
                return
            if n:
                decode.past += decode.lengths
            decode.tokens[:, 0] = nxt
            decode.lengths[:] = ~done  # a stopped sequence writes nothing more
            logits = self._run(decode, cache)

    def generate(self, input_ids: Any, max_new_tokens: int, *, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 stop: int | Iterable[int] | None = None) -> np.ndarray | list[np.ndarray]:
        """Generate up to ``max_new_tokens`` tokens after each prompt, as transformers' ``generate``.

        ``input_ids``: int [batch, length] (numpy or torch), or a list of sequences of different
        lengths. Greedy by default; ``do_sample`` draws with ``temperature`` / ``top_k`` / ``top_p``
        from a generator seeded with ``seed`` (reproducible). ``stop``: a token id or ids that end a
        sequence (included in it). Returns int64 [batch, length + new] for a rectangular input
        (sequences that stopped early padded with their stop token, as transformers pads with
        ``eos``), else one int64 array per sequence (its prompt and new tokens up to its stop).
        A prompt (plus ``max_new_tokens``) longer than ``max_length``, or a token id outside the
        vocabulary, raises :class:`~byoc_hetero.InputError` before anything runs.
        """
        sampler = Sampler(do_sample, temperature, top_k, top_p, seed)
        prompts, rectangular = self._prompts(input_ids)
        self._check_room(prompts, max_new_tokens)
        self.check_sources()
        stop_ids = _stop_ids(stop)
        new = list(self._tokens(prompts, int(max_new_tokens), sampler, stop_ids))
        steps = np.stack(new, axis=1) if new else np.zeros((len(prompts), 0), dtype="int64")
        if rectangular:
            return np.concatenate([np.stack(prompts), steps], axis=1)
        out = []
        for b, p in enumerate(prompts):
            row = steps[b]
            ends = [i for i, t in enumerate(row) if int(t) in stop_ids]
            out.append(np.concatenate([p, row[: ends[0] + 1] if ends else row]))
        return out

    # ---- files ----------------------------------------------------------------------------------
    def _write_library(self, folder: Path) -> None:
        """``folder / LIBRARY``: the executable exported, or for a loaded generator the bytes of the file
        it was loaded from (TVM exports a built module, not a loaded library; the file was held open at
        load, so these are its bytes even where another save replaced the file since)."""
        target, partial = folder / LIBRARY, folder / ("partial." + LIBRARY)
        if self._library_file is None:
            self._executable.export_library(str(partial))
        elif target.exists() and os.path.samestat(os.fstat(self._library_file.fileno()), os.stat(target)):
            return  # saved over its own folder: the library is already there
        else:
            self._library_file.seek(0)
            with open(partial, "wb") as out:
                shutil.copyfileobj(self._library_file, out)
        os.replace(partial, target)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the generator to the folder ``path``: the built library (``model.so``), the oneDNN
        regions' constants in ``weights.bin`` (one tensor at a time, page-aligned: :mod:`.weights_file`;
        the library holds placeholders for them) and ``generator.json`` (the decoder's sizes,
        max_length, weights and their quantization error, the weights file's table). A generator loaded
        by :func:`load` writes the bytes of its library file, and one loaded from a version-1 folder
        (constants inside the library) is saved so again. Each file is written
        under another name, then renamed over the old one (a generator loaded from ``path`` keeps
        mapping the old files). Returns the folder."""
        self.check_sources()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self._write_library(folder)
        return_code_pages()  # export_library ran TVM's compiler (LLVM's object writer) again
        manifest = {"format": FORMAT, "version": VERSION if self._constants else 1, "max_length": self.max_length,
                    "weights": self.weights, "weight_error": self.weight_error, "spec": self.spec.to_json()}
        if self._constants:
            # the pages of the mapping the write reads go back tensor by tensor (not all resident at once)
            entries = write_weights(folder / WEIGHTS_FILE, self._constants,
                                    self._weights_file.release if self._weights_file is not None else None)
            manifest["weights_file"] = {"name": WEIGHTS_FILE, "tensors": [e.to_json() for e in entries]}
        (folder / ("partial." + MANIFEST)).write_text(json.dumps(manifest, indent=1))
        os.replace(folder / ("partial." + MANIFEST), folder / MANIFEST)
        return folder


def _mapped_weights(folder: Path, manifest: dict[str, Any]) -> MappedWeights:
    """The weights file a version-2 manifest names, mapped (ModelFileError when it does not fit)."""
    from ..errors import ModelFileError

    table = manifest.get("weights_file")
    if not isinstance(table, dict) or not isinstance(table.get("tensors"), list) \
            or Path(str(table.get("name", ""))).name != table.get("name"):
        raise ModelFileError(f"bh.llm.load: {folder / MANIFEST} has no valid 'weights_file' table (a file name in "
                             "the folder and its tensors)")
    where = folder / table["name"]
    return MappedWeights(where, [Entry.from_json(r, where) for r in table["tensors"]])


def load(path: str | os.PathLike) -> Generator:
    """A :class:`Generator` saved by :meth:`Generator.save` in the folder ``path``.

    The regions' constants are read from ``weights.bin`` through a memory map (no copy; the
    regions prepare their layouts from it, and its pages go back once they have: one copy of the
    weights resident). A file cut short, or a tensor whose bytes differ from those the build
    recorded (the region documents' digests), raises :class:`~byoc_hetero.errors.ModelFileError`
    naming the file and the tensor. Version-1 folders (constants inside the library) load as before.
    """
    from ..errors import ByocError, ModelFileError
    from ..library import load_module

    folder = Path(path)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise ModelFileError(f"bh.llm.load: {folder / MANIFEST} is not a readable generator manifest: {err}") from err
    if manifest.get("format") != FORMAT or manifest.get("version") not in READABLE:
        raise ModelFileError(f"bh.llm.load: {folder / MANIFEST} is format {manifest.get('format')!r} version "
                             f"{manifest.get('version')!r}; expected {FORMAT!r} version "
                             f"{' or '.join(map(str, READABLE))}")
    spec = DecoderSpec(**manifest["spec"])
    mapped = _mapped_weights(folder, manifest) if manifest["version"] >= 2 else None
    library = load_module(folder / LIBRARY)
    library_file = open(folder / LIBRARY, "rb")  # noqa: SIM115 - held by the generator (Generator.save copies it)
    try:
        gen = Generator(library, spec, manifest["max_length"], manifest.get("weights", "f32"),
                        manifest.get("weight_error"), constants=mapped.tensors if mapped else None,
                        weights_file=mapped)
    except (ByocError, ValueError, RuntimeError) as err:
        library_file.close()
        if mapped is None or isinstance(err, ModelFileError):
            raise
        raise ModelFileError(f"bh.llm.load: {mapped.path} does not hold the weights {folder / LIBRARY} was built "
                             f"with: {err}") from err
    gen._library_file = library_file
    return gen
