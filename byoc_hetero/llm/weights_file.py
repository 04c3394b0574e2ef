"""A generator's weights in a file of their own (``weights.bin``), mapped when the generator is loaded.

Why (issue 36: the process at its weights + KV cache + 10%). A library exported with its regions'
constants inside holds them in TVM's const loader, which deserializes its own copy when the library
loads and keeps it for the module's lifetime, beside the layouts the regions prepare (repack) from
it: a loaded generator held its weights twice. ``bh.llm`` builds its step with the oneDNN regions'
constants *external* (:func:`byoc_hetero.llm.generator.external_constants`): the library's const
loader holds placeholders (tensors of no elements, which the region runtime takes as "the constants
come later", docs/region-format.md "Calling convention"), and the generator hands the constants to
the regions itself.

``Generator.save`` writes them here (:func:`write_weights`), one tensor at a time (no copy of all of
them: the save's peak), each at an offset that is a multiple of :data:`ALIGN`. ``bh.llm.load`` maps
the file (:class:`MappedWeights`): the regions receive tensors over the mapping (no copy), check each
one's digest (recorded in the region documents at the build: a changed byte is an error naming the
file and the tensor) and prepare their layouts; the mapping's resident pages are then handed back
(:meth:`MappedWeights.release`). What a region reads in place (a layout equal to the file's: the
embedding's rows) comes back from the file's pages as it is read, clean and reclaimable; what it
prepared is its own copy: one copy of the weights in the process.

Layout: the tensors' bytes, row-major, each at a multiple of :data:`ALIGN`; the table (name, dtype,
shape, offset, bytes of each tensor) is in the generator's manifest (``generator.json``).
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm_ffi

from .._relax import tensor_view
from ..errors import ModelFileError

ALIGN = 4096
"""Each tensor starts at a multiple of this many bytes (a page: the mapped tensors are page-aligned)."""

FILE = "weights.bin"
"""The file's name in a saved generator's folder."""

SPILL_DIR = "BYOC_HETERO_WEIGHTS_DIR"
"""The environment variable naming the folder of :func:`spill_weights`'s files (default: the system's
temporary folder, ``tempfile.gettempdir()``); it should be on a disk, not in memory (a tmpfs keeps
the file's pages resident: nothing would be gained)."""


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in a weights file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        """The manifest's record of the tensor."""
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset,
                "nbytes": self.nbytes}

    @classmethod
    def from_json(cls, record: Any, where: Path) -> Entry:
        """The entry of a manifest record; ModelFileError naming ``where`` when it is malformed."""
        try:
            entry = cls(str(record["name"]), str(record["dtype"]), tuple(int(d) for d in record["shape"]),
                        int(record["offset"]), int(record["nbytes"]))
            itemsize = np.dtype(entry.dtype).itemsize
        except (KeyError, TypeError, ValueError) as err:
            raise ModelFileError(f"bh.llm.load: {where}: a malformed weights record {str(record)[:120]!r}: {err}") \
                from None
        if entry.offset < 0 or entry.offset % ALIGN or entry.nbytes != itemsize * math.prod(entry.shape) \
                or min(entry.shape, default=0) < 0:
            raise ModelFileError(f"bh.llm.load: {where}: the weights record of {entry.name!r} ({entry.dtype} "
                                 f"{list(entry.shape)}, {entry.nbytes} bytes at offset {entry.offset}) is not "
                                 f"consistent (offsets are multiples of {ALIGN}, bytes = elements x item size)")
        return entry


def _bytes(tensor: Any) -> np.ndarray:
    """The bytes of a CPU tensor, row-major (a view, no copy, where numpy can view its dtype)."""
    return np.ascontiguousarray(tensor_view(tensor)).reshape(-1).view(np.uint8)


def write_weights(path: str | os.PathLike, constants: Mapping[str, Any],
                  after_each: Callable[[], None] | None = None) -> list[Entry]:
    """Write ``constants`` (name -> CPU tensor) to the file ``path`` and return where each lies.

    One tensor at a time, from its own memory (no copy of the weights); ``after_each`` is called after
    each (a mapping's :meth:`MappedWeights.release`: the pages the write read go back as it goes). The
    file is written under another name and then renamed over ``path``: a generator loaded from ``path``
    keeps mapping the old file's bytes (a write in place would change, or cut short, what it maps).
    """
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    entries, end = [], 0
    with open(partial, "wb") as f:
        for name, tensor in constants.items():
            data = _bytes(tensor)
            offset = -(-end // ALIGN) * ALIGN
            f.seek(offset)  # the gap reads as zeros
            f.write(memoryview(data))
            entries.append(Entry(name, str(tensor.dtype), tuple(int(d) for d in tensor.shape), offset, data.nbytes))
            end = offset + data.nbytes
            if after_each is not None:
                after_each()
    os.replace(partial, path)
    return entries


class MappedWeights:
    """The tensors of a weights file as TVM tensors over one mapping of it (no copy).

    The mapping is read-only: its pages are the file's, in the page cache, shared and reclaimable. A
    file shorter than its table says raises ModelFileError naming the file and the first tensor past its
    end, before anything is mapped.
    """

    def __init__(self, path: str | os.PathLike, entries: list[Entry]):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                for e in entries:
                    if e.offset + e.nbytes > size:
                        raise ModelFileError(
                            f"bh.llm.load: {self.path} is {size} bytes, but tensor {e.name!r} ({e.dtype} "
                            f"{list(e.shape)}, {e.nbytes} bytes at offset {e.offset}) ends at byte "
                            f"{e.offset + e.nbytes} (the file is cut short)")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as err:
            raise ModelFileError(f"bh.llm.load: cannot read {self.path}: {err.strerror or err}") from err
        self.tensors = {e.name: self._tensor(e) for e in entries}
        """name -> a TVM tensor over the mapping."""

    def _tensor(self, e: Entry) -> Any:
        if e.nbytes == 0:
            return tvm_ffi.from_dlpack(np.zeros(e.shape, e.dtype))
        array = np.frombuffer(self._map, dtype=e.dtype, count=math.prod(e.shape), offset=e.offset).reshape(e.shape)
        # read-only memory (PROT_READ: a write would fault, never change the file's bytes unseen); DLPack 1.0
        # carries the read-only flag (numpy exports a read-only array only so)
        return tvm_ffi.from_dlpack(array.__dlpack__(max_version=(1, 0)), require_alignment=64, require_contiguous=True)

    def release(self) -> None:
        """Hand back the mapping's resident pages (``madvise(MADV_DONTNEED)``): clean pages of the
        file, read again from it (the page cache) where a region reads a tensor in place later."""
        if self._map is not None and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED)


def spill_weights(constants: Mapping[str, Any]) -> MappedWeights | None:
    """``constants`` (name -> CPU tensor) written to a temporary weights file and mapped from it: what an
    in-process generator gives its regions, so that it holds its weights as a loaded one does (issue 36).

    The build's arrays (a file's dequantized weights, int8 / int4 codes, q / k / v concatenated) or a
    model's tensors can then be dropped: the regions prepare their layouts from the mapping, whose pages
    are clean and go back (:meth:`MappedWeights.release`), where the arrays would stay resident beside the
    prepared copy for as long as the generator lives. The file is written one tensor at a time (no copy
    of the weights in memory) in the folder :data:`SPILL_DIR` names (else the system's temporary folder)
    and unlinked once mapped (nothing is left behind; its disk space goes back with the generator).
    None where it cannot be written (no space, a read-only folder): the caller keeps the arrays.
    """
    if not constants:
        return None
    folder = os.environ.get(SPILL_DIR) or tempfile.gettempdir()
    try:
        handle, name = tempfile.mkstemp(prefix="byoc_hetero-weights-", suffix=".bin", dir=folder)
    except OSError:
        return None
    os.close(handle)
    path = Path(name)
    try:
        entries = write_weights(path, constants)
        return MappedWeights(path, entries)
    except (OSError, ModelFileError):
        return None
    finally:
        for leftover in (path, path.with_name(path.name + ".partial")):
            try:
                leftover.unlink()  # the mapping keeps the file's bytes
            except OSError:
                pass


COMPILER_LIBRARY = "libtvm_compiler"
"""The shared library whose code :func:`return_code_pages` hands back after a build (TVM's compiler:
``relax.build`` runs it, a generator's calls do not)."""


def _unmodified_mappings(library: str) -> list[tuple[int, int]]:
    """(start, length) of this process's read-only mappings of files named ``library...`` whose resident pages
    are all the file's (/proc/self/smaps: no ``Anonymous`` page, none written: a relocated data segment's
    private copies are left alone)."""
    found, current = [], None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if head and "-" in head[0] and not head[0].endswith(":"):
                    current = None
                    if len(head) >= 6 and os.path.basename(head[5]).startswith(library) and "w" not in head[1]:
                        begin, end = (int(x, 16) for x in head[0].split("-"))
                        current = (begin, end - begin)
                elif current is not None and head and head[0] == "Anonymous:":
                    if int(head[1]) == 0:
                        found.append(current)
                    current = None
    except OSError:
        return []
    return found


def return_code_pages(library: str = COMPILER_LIBRARY) -> int:
    """Hand back the resident pages of the shared library ``library``'s read-only, unmodified mappings
    (``madvise(MADV_DONTNEED)``: clean pages of its file, read again from the page cache where its code runs
    later) and return how many bytes they spanned. What an in-process generator's build leaves resident of
    TVM's compiler (38 MiB at any model size, session 15: 8% of an int8 Qwen2.5-0.5B's weights): the calls
    never run it. Linux only (elsewhere, or without ``madvise``: nothing, 0)."""
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    spanned = 0
    for begin, length in _unmodified_mappings(library):
        if madvise(begin, length, mmap.MADV_DONTNEED) == 0:
            spanned += length
    return spanned
