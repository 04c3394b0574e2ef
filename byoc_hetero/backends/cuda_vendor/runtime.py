"""The cuda_vendor backend's runtime library, loaded on first need, and its modules read back.

``libbyoc_hetero_cuda.so`` (``cpp/cuda/``, built by CMake only where the CUDA headers of the
``[cuda]`` extra are found) registers ``byoc_hetero.cuda.create`` and the loader of exported
modules of kind :data:`RUNTIME_KIND`. It links no CUDA library: the CUDA runtime and cuBLASLt are
loaded when a region first runs, cuDNN when a region with a conv2d does. Importing byoc_hetero
loads none of this; :func:`load` is called by the codegen, and by whoever loads an exported library
holding cuda regions (``tools/gpu_check.py`` loads the file with ctypes).
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import os
from pathlib import Path
from typing import Any

import tvm

from ...errors import ByocError

RUNTIME_KIND = "byoc_hetero_cuda"
"""The ``kind`` of the runtime modules the cuda_vendor backend's codegen creates."""

LIBRARY = "libbyoc_hetero_cuda.so"
"""The runtime library's file name (beside the package's ``_C`` extension when built)."""

_WHEEL_LIBRARIES = (("nvidia-cuda-runtime-cu12", "libcudart.so.12"), ("nvidia-cublas-cu12", "libcublasLt.so.12"),
                    ("nvidia-cudnn-cu12", "libcudnn.so.9"))


def library_path() -> Path | None:
    """Where the runtime library is: ``$BYOC_HETERO_CUDA_LIB``, else beside the package; None if not built."""
    given = os.environ.get("BYOC_HETERO_CUDA_LIB")
    path = Path(given) if given else Path(__file__).resolve().parents[2] / LIBRARY
    return path if path.is_file() else None


def _preload_wheel_libraries() -> None:
    """Load the CUDA libraries of the ``[cuda]`` extra's wheels where installed, so that the
    runtime's dlopen finds them by soname (their folders are on no library path)."""
    for dist, name in _WHEEL_LIBRARIES:
        try:
            files = md.distribution(dist).files or []
        except md.PackageNotFoundError:
            continue
        for f in files:
            if f.name == name:
                try:
                    ctypes.CDLL(str(f.locate()), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass  # the runtime's own search then says what is missing
                break


def load() -> None:
    """Load the runtime library (once); :class:`ByocError` saying how to get it when it is not built."""
    if tvm.get_global_func("byoc_hetero.cuda.create", allow_missing=True) is not None:
        return
    path = library_path()
    if path is None:
        raise ByocError(f"the cuda_vendor backend's runtime library {LIBRARY} is not built: install the CUDA headers "
                        "(pip install 'byoc-hetero[cuda]': nvidia-cublas-cu12, nvidia-cuda-runtime-cu12, "
                        "nvidia-cudnn-cu12, ...) and build again, or set BYOC_HETERO_CUDA_LIB to the library's path")
    _preload_wheel_libraries()
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def built() -> bool:
    """Whether the runtime library is there (built, or already loaded)."""
    return tvm.get_global_func("byoc_hetero.cuda.create", allow_missing=True) is not None or library_path() is not None


def availability() -> str:
    """``""`` when a cuda region can run here, else why not (the library not built, a CUDA library
    missing, no driver or no GPU), as the runtime words it."""
    try:
        load()
    except ByocError as err:
        return str(err)
    return str(tvm.get_global_func("byoc_hetero.cuda.availability")())


def create_module(document: dict[str, Any]) -> tvm.runtime.Module:
    """The runtime module of one region document (parsed and checked; nothing CUDA is loaded)."""
    load()
    return tvm.get_global_func("byoc_hetero.cuda.create")(json.dumps(document))


def region_graph(module: tvm.runtime.Module) -> dict[str, Any] | None:
    """The region document of one of this runtime's modules, else None."""
    if module.kind != RUNTIME_KIND:
        return None
    return json.loads(module["get_graph_json"]())


__all__ = ["LIBRARY", "RUNTIME_KIND", "availability", "built", "create_module", "library_path", "load",
           "region_graph"]
