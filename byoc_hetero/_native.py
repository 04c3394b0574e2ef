"""Load the compiled extension ``byoc_hetero._C``.

The extension links oneDNN (from the ``onednn-cpu-gomp`` wheel, whose library lands in the
environment's ``lib/``) and libtvm_ffi (from ``apache-tvm-ffi``).  Importing ``tvm`` first makes
libtvm_ffi resident; oneDNN is preloaded from the installed distribution's file list so the
extension loads in any environment layout (venv, system prefix, user site).  Importing the
extension registers the runtime's TVM globals (``byoc_hetero.runtime.create`` and the module
loader ``ffi.Module.load_from_bytes.byoc_hetero``).
"""

from __future__ import annotations

import ctypes
import importlib.metadata as _md

import tvm  # noqa: F401  (loads libtvm_ffi before the extension needs it)


def _preload_onednn() -> None:
    try:
        files = _md.distribution("onednn-cpu-gomp").files or []
    except _md.PackageNotFoundError:
        return  # fall back on the extension's rpath
    for f in files:
        name = f.name
        if name.startswith("libdnnl.so"):
            path = f.locate()
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                return
            except OSError:
                continue


_preload_onednn()

from . import _C  # noqa: E402  (after the preloads above)

__all__ = ["_C"]
