"""The op families of the oneDNN backend, one module each.

Every module here declares, side by side, the patterns and checks of its ops (what the runtime can
run) and their lowering to region-graph nodes, through the decorators of :mod:`..table`. Adding an
op is one new module here (found by :func:`load`), one kernel file in ``cpp/kernels/`` and one row
in ``docs/region-format.md``.
"""

from __future__ import annotations

import importlib
import pkgutil


def load() -> list[str]:
    """Import every op family module of this package (each registers itself); their names."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names
