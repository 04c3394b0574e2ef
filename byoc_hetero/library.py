"""Load an exported library safely: its ELF structure is checked against the file before the dynamic
loader maps it.

Why. ``ex.export_library("model.so")`` writes an ELF shared object; ``tvm.runtime.load_module``
hands it to ``dlopen``, which maps the file and trusts its headers. A file cut short (a copy that
stopped, a full disk) leaves headers that point past its end, and touching those pages kills the
process with SIGBUS: 9 of 15 truncations did (issue 27). :func:`load_module` reads the headers
first and raises :class:`IntegrityError` naming the file and what does not fit, so a damaged file is
a Python error. The regions inside carry digests of their documents and constants (checked by the
runtime when they load, docs/region-format.md "Integrity"), so damage inside the file that keeps its
structure is an error naming the region, never a different answer.

What is checked (ELF64 and ELF32, either byte order): the identification bytes; the ELF header size;
the program header table and every segment's file bytes; the section header table and every
section's file bytes (``SHT_NOBITS`` sections occupy none) all lie inside the file; the section name
table index is in range. This is a structural check, not a verification of the machine code; a
raw ``tvm.runtime.load_module`` of a damaged file skips it (TVM's business, not ours).

Memory. The modules of a library (a decoder's weights among the constants) are serialized into one
array embedded in the file, ``__tvm_ffi__library_bin``; loading reads it once and builds the modules
from it, in memory of their own. The pages of the array read stay resident, mapped from the file (as
large as the weights again: issue 36): :func:`load_module` hands them back afterwards
(:func:`release_embedded_bytes`). They are clean pages of a read-only mapping, so a later read (an
``export_library`` of the loaded module reads the modules, not the array) finds the file's bytes again.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from pathlib import Path

import tvm

from .errors import IntegrityError, ModelFileError

__all__ = ["check_library", "load_module", "release_embedded_bytes"]

_SHT_NOBITS = 8
_MADV_DONTNEED = 4
_EMBEDDED = "__tvm_ffi__library_bin"  # tvm_ffi's symbol of the serialized modules (tvm/ffi/extra/module.h)


def _fail(path: Path, what: str) -> IntegrityError:
    return IntegrityError(f"library {str(path)!r} is damaged or not a shared library: {what}")


def _header_fields(data: bytes, path: Path) -> tuple[str, bool, tuple]:
    """(byte-order prefix, 64-bit?, the ELF header's fields after e_ident) of the file's first bytes."""
    if len(data) < 16 or data[:4] != b"\x7fELF":
        raise _fail(path, f"expected the ELF magic 7f 45 4c 46 at the start of its {len(data)} bytes, got "
                          f"{data[:4].hex(' ') or 'nothing'}")
    cls, order = data[4], data[5]
    if cls not in (1, 2) or order not in (1, 2):
        raise _fail(path, f"unknown ELF class {cls} or byte order {order}")
    prefix, wide = ("<" if order == 1 else ">"), cls == 2
    fmt = prefix + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH")
    size = 16 + struct.calcsize(fmt)
    if len(data) < size:
        raise _fail(path, f"it starts with {len(data)} bytes, the ELF header needs {size} (cut short?)")
    return prefix, wide, struct.unpack_from(fmt, data, 16)


def _table(path: Path, what: str, offset: int, count: int, entry: int, minimum: int, file_size: int) -> None:
    if count == 0:
        return
    if entry < minimum:
        raise _fail(path, f"{what} entries of {entry} bytes (expected at least {minimum})")
    if offset + count * entry > file_size:
        raise _fail(path, f"the {what} table ({count} x {entry} bytes at offset {offset}) ends at byte "
                          f"{offset + count * entry}, past the end of the {file_size}-byte file (cut short?)")


def check_library(path: str | os.PathLike) -> Path:
    """Check that the ELF headers of ``path`` fit the file (see the module docstring); returns the
    path. Raises :class:`IntegrityError` for a file that is missing a part or is not ELF, and
    :class:`~byoc_hetero.errors.ModelFileError` for a missing or unreadable file. Reads the headers
    only (a few kilobytes), not the whole file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(64)
            prefix, wide, h = _header_fields(head, path)
            phoff, shoff = h[4], h[5]
            phentsize, phnum, shentsize, shnum, shstrndx = h[8], h[9], h[10], h[11], h[12]
            _table(path, "program header", phoff, phnum, phentsize, 56 if wide else 32, size)
            _table(path, "section header", shoff, shnum, shentsize, 64 if wide else 40, size)
            f.seek(phoff)
            segments = f.read(phnum * phentsize)
            f.seek(shoff)
            sections = f.read(shnum * shentsize)
    except OSError as err:
        raise ModelFileError(f"cannot read library {str(path)!r}: {err.strerror or err}") from err
    seg = prefix + ("IIQQQQQQ" if wide else "IIIIIIII")
    for i in range(phnum):
        fields = struct.unpack_from(seg, segments, i * phentsize)
        offset, filesz = (fields[2], fields[5]) if wide else (fields[1], fields[4])
        if offset + filesz > size:
            raise _fail(path, f"segment {i} ({filesz} bytes at offset {offset}) ends past the end of the "
                              f"{size}-byte file (cut short?)")
    sec = prefix + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
    for i in range(shnum):
        fields = struct.unpack_from(sec, sections, i * shentsize)
        kind, offset, length = fields[1], fields[4], fields[5]
        if kind != _SHT_NOBITS and offset + length > size:
            raise _fail(path, f"section {i} ({length} bytes at offset {offset}) ends past the end of the "
                              f"{size}-byte file (cut short?)")
    if shnum and shstrndx >= shnum:
        raise _fail(path, f"the section name table index {shstrndx} is not among its {shnum} sections")
    return path


def load_module(path: str | os.PathLike) -> tvm.runtime.Module:
    """``tvm.runtime.load_module(path)`` after :func:`check_library`: a library exported with
    ``export_library`` (its regions need this package, which registers their loader).

    A file cut short or otherwise structurally damaged raises :class:`IntegrityError` naming the file
    instead of crashing the process in the dynamic loader; a region whose document or constants
    were damaged raises :class:`IntegrityError` naming the region (when it loads, or when its
    constants first arrive, at the first call).

    >>> lib = bh.load_module("model.so")
    >>> vm = tvm.relax.VirtualMachine(lib, tvm.cpu())
    """
    lib = tvm.runtime.load_module(str(check_library(path)))
    release_embedded_bytes(path)
    return lib


def _read_only_spans() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings without write permission (/proc/self/maps)."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2 and fields[1][1] == "-":
                lo, hi = fields[0].split("-")
                spans.append((int(lo, 16), int(hi, 16)))
    return spans


def release_embedded_bytes(path: str | os.PathLike) -> int:
    """Hand back the resident pages of the serialized modules embedded in the loaded library ``path``
    (see Memory in the module docstring): the whole pages inside ``__tvm_ffi__library_bin`` that lie in
    a read-only mapping of the file are dropped from the process (``madvise(MADV_DONTNEED)``; the
    file's bytes come back on a later read). Returns the bytes released; 0 where there is nothing to
    release (a library without the array, not loaded, or not Linux)."""
    try:
        lib = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):
        return 0
    try:
        start = ctypes.addressof(ctypes.c_uint64.in_dll(lib, _EMBEDDED))
        end = start + 8 + ctypes.c_uint64.in_dll(lib, _EMBEDDED).value  # a u64 of its length, then the bytes
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, end // page * page
        released = 0
        for a, b in _read_only_spans():
            a, b = max(a, lo), min(b, hi)
            if a < b and ctypes.CDLL(None).madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), _MADV_DONTNEED) == 0:
                released += b - a
        return released
    except (ValueError, OSError, AttributeError):
        return 0
    finally:
        import _ctypes

        _ctypes.dlclose(lib._handle)  # the reference RTLD_NOLOAD took
